"""Two drafters on the same held-out answers: the difference in mean acceptance length, paired.

Each drafter is scored as `doctor drafter --depth 3` scores it (chain, ungated, 1 + accepted per round
as vLLM counts it) on a held-out dataset holding ITS capture points; both datasets must hold the
target's answers to the same prompts (the same `responses.jsonl`, extracted at each drafter's points).
The 95% interval resamples answers jointly (decoding/acceptance.paired_interval): a shared answer's
difficulty cancels, so a difference of ~0.02 is resolved where the two separate intervals overlap.

Usage: python benchmarks/bench_paired.py --a runs/anchor/ours --a-heldout runs/q/heldout \
           --b runs/anchor-deep/ours --b-heldout runs/q-deep/heldout [--depth 3] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.decoding.acceptance import chain_stats, paired_interval
from eaglewire.saved.checkpoint import load_checkpoint, resolve_dir
from eaglewire.targets.load import load_target


def per_answer(drafter: Path, heldout: Path, depth: int) -> dict[int, list[int]]:
    """{prompt index: [accepted drafts, rounds]} of one drafter on its held-out dataset."""
    model, prov = load_checkpoint(resolve_dir(drafter))
    head_w = load_target(prov.target.source).model.get_output_embeddings().weight.detach().float()
    ds = FeatureDataset(heldout)
    order = [j for shard in ds.manifest.shards for j in shard["indices"]]  # the dataset's sample order
    with torch.inference_mode():
        st = chain_stats(model, ds, head_w, len(ds), depth, per_sample=True)
    return dict(zip(order, st["per_sample"], strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for side in ("a", "b"):
        ap.add_argument(f"--{side}", type=Path, required=True, help=f"drafter {side.upper()} (a training run or checkpoint)")
        ap.add_argument(f"--{side}-heldout", type=Path, required=True, help=f"held-out dataset at drafter {side.upper()}'s points")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    pa, pb = per_answer(a.a, a.a_heldout, a.depth), per_answer(a.b, a.b_heldout, a.depth)
    if set(pa) != set(pb):
        raise SystemExit(f"the held-out datasets hold different answers ({len(set(pa) ^ set(pb))} not in both)")
    keys = sorted(pa)
    res = {"drafter_a": str(a.a), "drafter_b": str(a.b), "depth": a.depth, **paired_interval([pa[k] for k in keys], [pb[k] for k in keys])}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    lo, hi = res["ci95"]
    print(f"A {res['a']:.3f}  B {res['b']:.3f}  B - A {res['diff']:+.3f} (95% {lo:+.3f} to {hi:+.3f}, paired over "
          f"{res['answers']} answers); B accepts more on {res['b_better_on']} of them")


if __name__ == "__main__":
    main()
