"""`layers`: ids converted between engines through physical points, and which engines capture from a class.

Torch-free on purpose: `eaglewire layers` answers without loading a model or
importing torch.
"""

from __future__ import annotations

from eaglewire.targets.config import LayersConfig
from eaglewire.targets.points import Engine, id_lists, points_from_ids, version_differences
from eaglewire.targets.registry import RUNTIMES, pinned_version
from eaglewire.targets.support import capture_refusal, capture_support


def convert_layers(cfg: LayersConfig) -> dict:
    """What `layers` reports: the given ids as physical points and as every engine's ids, with warnings."""
    eng = Engine.parse(cfg.layers_from, cfg.arch or None)
    pts = points_from_ids(cfg.ids, eng, cfg.target_layers)
    res = id_lists(pts, cfg.target_layers)
    res["from"] = {"engine": eng.label(), "ids": cfg.ids, "assumed": eng.assumptions()}
    # how SGLang versions read the given ids, and the classic SGLang ids printed in the table
    sg = res["sglang"] if None not in res["sglang"] else None
    found = [version_differences(cfg.ids, eng, cfg.target_layers),
             sg and version_differences(sg, Engine("sglang", None, cfg.arch or None), cfg.target_layers)]
    if cfg.arch:  # an engine that cannot capture from this class at all is named, whatever the ids say
        found += [e["refusal"] for e in engine_support(cfg.arch).values()]
    res["warnings"] = list(dict.fromkeys(w for w in found if w))
    return res


def engine_support(arch: str) -> dict[str, dict]:
    """Per pinned engine, whether it can capture EAGLE-3 features from this class at all, and why not."""
    return {f"{e} {pinned_version(e)}": {"support": capture_support(e, None, arch),
                                         "refusal": capture_refusal(e, None, arch)} for e in RUNTIMES}
