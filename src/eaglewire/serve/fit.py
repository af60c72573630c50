"""`serve --print-command` for another machine: does the drafter fit the target named, and on how many devices?

The printing machine may hold only the target's config.json (a 1T-parameter target is sized, never loaded):
the drafter's recorded target fingerprint (hidden size, vocabulary, layers) is compared with that config,
so a drafter trained on one model is refused for another before a GPU box loads both and drafts garbage.
The tensor-parallel size comes from `plan`'s own engine sizing (weights and KV cache against a device's
memory, TP dividing the heads), so the two commands cannot disagree.
"""

from __future__ import annotations

import sys

from eaglewire.infra.errors import EaglewireError
from eaglewire.plan.config import PlanConfig
from eaglewire.plan.estimate import serving_setup
from eaglewire.plan.hardware import ASSUMED, DEVICES
from eaglewire.plan.shape import target_config
from eaglewire.targets.hfconfig import text_config


def read_target_config(source: str) -> dict | None:
    """The target's config as this machine can read it (a directory, a cached hub id, a GGUF); None when only
    the serving machine has it (then nothing can be checked here, and a note says so)."""
    try:
        return target_config(source)
    except EaglewireError as e:
        print(f"note: the target's config is not readable here ({str(e)[:160]}): the drafter's fit and the "
              "tensor-parallel size are not checked; pass --target DIR holding its config.json to check them",
              file=sys.stderr)
        return None


def refuse_misfit(prov, ckpt, source: str, raw: dict) -> None:
    """One line when the drafter was trained on a target of another shape than `source`."""
    tc = text_config(raw)
    fp = prov.fingerprint
    want = {"hidden size": fp.hidden_size, "vocabulary": fp.vocab_size, "layers": fp.num_layers}
    have = {"hidden size": tc.get("hidden_size"), "vocabulary": tc.get("vocab_size", raw.get("vocab_size")),
            "layers": tc.get("num_hidden_layers")}
    bad = [k for k in want if want[k] is not None and have[k] is not None and want[k] != have[k]]
    if bad:
        trained = prov.target.source or "its recorded target"
        raise EaglewireError(
            f"drafter {ckpt} does not fit target {source}: trained on {trained} ("
            + ", ".join(f"{k} {want[k]}" for k in bad) + "), the target's config has "
            + ", ".join(f"{k} {have[k]}" for k in bad)
            + ": pass --target with the model the drafter was trained for, or train a drafter for this one")


def tensor_parallel(raw_source: str, tp: int, device: str) -> tuple[int, str]:
    """(TP size, how it was chosen): --tp when given, else the smallest TP `plan` finds for one `device` node."""
    if tp:
        return tp, "--tp"
    dev = device or ASSUMED
    eng = serving_setup(PlanConfig(target=raw_source, device=dev if dev in DEVICES else ASSUMED))
    setup = eng["setup"]
    if setup is None:
        raise EaglewireError(f"target {raw_source}: {eng['line']} on {dev}: pass --tp (and serve it "
                             "across nodes as your engine's multi-node guide says)")
    if setup["pipeline_parallel_size"] > 1:  # one node's command would run out of memory at this TP alone
        raise EaglewireError(f"target {raw_source}: one node of {dev} does not hold it ({eng['line']}): "
                             "serve it across nodes as your engine's multi-node guide says, or name a larger "
                             "--gpu; --tp sets the size yourself")
    return setup["tensor_parallel_size"], f"plan's sizing for {dev} ({eng['line']}; --tp overrides)"
