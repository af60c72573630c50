"""`layers`: ids converted between engines through physical points, and which engines capture from a class.

Torch-free on purpose: `eaglewire layers` answers without loading a model or
importing torch.
"""

from __future__ import annotations

import json

from eaglewire.targets.config import LayersConfig
from eaglewire.targets.points import (
    Engine,
    Point,
    fed_points,
    id_lists,
    ids_for_points,
    points_from_ids,
    version_differences,
)
from eaglewire.targets.registry import RUNTIMES, engine_spec, pinned_version
from eaglewire.targets.support import capture_refusal, capture_support
from eaglewire.targets.vllm_pp import describe, pp_option


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
    if cfg.pipeline_parallel_size > 1:
        found += pipeline_warnings(res, cfg, eng, pts)
    res["warnings"] = list(dict.fromkeys(w for w in found if w))
    return res


def pipeline_warnings(res: dict, cfg: LayersConfig, eng: Engine, pts: list[Point]) -> list[str]:
    """vLLM over the stages asked for: its ids for the points (res["vllm_pp"]), and where the given ids,
    read by vLLM, would feed other points than on one stage."""
    L, arch = cfg.target_layers, cfg.arch or None
    stages = pp_option(L, cfg.pipeline_parallel_size)
    vllm = Engine("vllm", None, arch)
    ids = ids_for_points(pts, vllm, L, pp=stages)
    res["vllm_pp"] = {"stages": [list(b) for b in stages.bounds], "ids": ids, "rule": describe(arch, stages)}
    out = [res["vllm_pp"]["rule"], f"vLLM ids over {stages.label()}: {json.dumps(ids)}" + (
        f" ({', '.join(p.name for p, i in zip(pts, ids) if i is None)} cannot be fed with any id)" if None in ids else "")]
    if (engine_spec(eng.name).runtime or eng.name) == "vllm":  # the given ids are vLLM's: what the split feeds
        fed = fed_points(cfg.ids, vllm, L, pp=stages)
        if fed != fed_points(cfg.ids, vllm, L):
            got = ", ".join(p.name for p in fed if p) or "nothing"
            out.append(f"over {stages.label()} vLLM feeds ids {cfg.ids} as {got}" + (
                f" ({fed.count(None)} of them feed nothing)" if None in fed else "")
                + f", not {', '.join(p.name for p in pts)} as on one stage")
    return out


def engine_support(arch: str) -> dict[str, dict]:
    """Per pinned engine, whether it can capture EAGLE-3 features from this class at all, and why not."""
    return {f"{e} {pinned_version(e)}": {"support": capture_support(e, None, arch),
                                         "refusal": capture_refusal(e, None, arch)} for e in RUNTIMES}
