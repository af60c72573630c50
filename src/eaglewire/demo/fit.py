"""The demo's preset fitted to its target: the one place that decides what a target changes, and says why.

A preset is written for a real target. Two kinds of target cannot run it as
written, and the demo adapts rather than stopping halfway:

- a tiny builder (`tiny:<arch>`): random weights made to check wiring, so its
  answers carry no signal and a quick preset's 640 answers of 128 tokens buy
  nothing but time (tens of minutes on a 61-layer tiny Kimi-K2.5). Every stage
  runs at the smallest size that still exercises it; the held-out prompts stay
  all 54, so the held-out figure keeps its interval.
- a target whose decoder layer after the deepest capture point has no Llama
  counterpart (MLA attention, a mixture of experts, linear attention): the
  warm start `--init target` cannot copy it, so the drafter starts from the
  head (`--init head`), which every target has.

The fitted values are what `--print-commands` prints and the run records, and
the reasons go into the report, so nothing changes silently.
"""

from __future__ import annotations

import torch

from eaglewire.drafter.warmstart import deepest_layer_slot, not_llama_shaped
from eaglewire.targets import families
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.load import checked_target_dir, resolve_target_dir
from eaglewire.targets.points import Point, point_option

TINY_PREFIX = "tiny:"
# the smallest sizes at which every stage still runs and reports (a validation split, a bench round, a held-out
# answer per prompt with drafting rounds in it); a preset already smaller keeps its own value
TINY = dict(topic_prompts=8, max_new_tokens=8, train_epochs=1, max_len=64, bench_prompts=1, bench_tokens=4,
            heldout_tokens=4)


def fit_preset(preset: dict, target: str) -> tuple[dict, list[str]]:
    """(the preset's values for this target, one sentence per change saying why); unchanged for a real Llama-like one."""
    p, why = dict(preset), []
    if target.startswith(TINY_PREFIX):
        small = {k: v for k, v in TINY.items() if k in p and v < p[k]}
        p.update(small)
        if small:
            why.append(f"{target} is a tiny random model (built to check the wiring; its answers carry no signal), so "
                       "every stage runs at its smallest size: " + ", ".join(f"{k} {v}" for k, v in small.items()))
    if p.get("init") == "target" and (refusal := warm_start_refusal(target, p.get("points"))):
        p["init"] = "head"
        why.append(f"--init head instead of the preset's --init target: {refusal}")
    return p, why


def warm_start_refusal(target: str, points: str | None) -> str | None:
    """Why `--init target` cannot copy this target's layer after the deepest capture point (None: it can).

    Read from the target's own classes on the meta device (config.json only, no weight is read), by the
    warm start's own test, so the demo's choice and training's refusal cannot disagree.
    """
    config = families.text_config(families.native_config(checked_target_dir(resolve_target_dir(target))))
    with torch.device("meta"):
        layers = decoder_stack(families.build_causal_lm(config)).layers
    names = [q.name for q in point_option([points] if points else [], len(layers))]
    deepest = names[deepest_layer_slot(names)]
    k = Point.parse(deepest).layer + 1
    if k >= len(layers):
        return f"no target layer follows the deepest capture point {deepest}"
    why = not_llama_shaped(layers[k])
    return f"the target's layer {k} {why}, which the drafter's Llama layer cannot start from" if why else None
