"""Held-out drafter quality as vLLM reports it: mean acceptance length at chain depth 3, ungated.

Scores drafters on a dataset of the target's greedy answers to the shipped
held-out prompts (no training set uses them). On greedy answers, chain
decoding accepts draft k exactly when the drafter's argmax at depth k equals
the answer's next token, so one TTT-style unroll per answer gives every
round's accept length; rounds are then taken as decoding takes them (a round
that accepts r drafts moves r + 1 tokens on). The figure is 1 + accepted per
round, per position (the share of rounds accepting draft k) and per prompt
category. Served by vLLM, the same drafter accepted what this predicts
(1.534 served vs 1.532 predicted, README).

    eaglewire data build --target default --prompts src/eaglewire/bench_prompts/heldout.jsonl \\
        --max-new-tokens 160 --gen-batch-size 54 --out runs/heldout160
    python benchmarks/bench_heldout.py --heldout runs/heldout160 runs/demo-quick/train/drafter --json OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.doctor.heldout import per_category, shipped_categories
from eaglewire.saved.checkpoint import load_checkpoint


def categories(heldout: Path, ds: FeatureDataset, tokenizer) -> list[str]:
    cats = shipped_categories(ds, tokenizer)
    if cats is None:
        raise SystemExit(f"{heldout}: not a dataset of the shipped held-out prompts (a sample matches none or several)")
    return cats


def score(ckpt: Path, heldout: Path, head_w: torch.Tensor, cats: list[str], depth: int = 3) -> dict:
    model, _ = load_checkpoint(ckpt)
    model.eval()
    ds = FeatureDataset(heldout, verify=False)
    allr = chain_stats(model, ds, head_w, len(ds), depth)
    per_cat = {c: round(v["mean_acceptance_length"], 3) for c, v in per_category(model, ds, head_w, depth, cats).items()}
    return {"drafter": str(ckpt), "depth": depth, "mean_acceptance_length": allr["mean_acceptance_length"],
            "ci95": allr["mean_acceptance_length_ci95"], "acceptance_rate_per_position": allr["acceptance_rate_per_position"], "rounds": allr["rounds"],
            "acc": allr["acc"], "tau_all_positions": allr["tau_chain"], "per_category": per_cat}


class SlotShuffled:
    """The dataset with one slot's features shuffled over positions within each sample.

    Permutation importance: the slot keeps its values and scale but loses its
    alignment with the tokens, so the drop in acceptance is what the drafter
    gets from that slot.
    """

    def __init__(self, ds: FeatureDataset, slot: int, seed: int = 0):
        self.ds, self.slot, self.seed, self.manifest = ds, slot, seed, ds.manifest

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        item = dict(self.ds[i])
        f = item["features"].clone()  # [T, P, H]
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        f[:, self.slot] = f[torch.randperm(f.shape[0], generator=g), self.slot]
        item["features"] = f
        return item


def slot_ablation(ckpt: Path, heldout: Path, head_w: torch.Tensor, depth: int = 3) -> list[dict]:
    model, _ = load_checkpoint(ckpt)
    model.eval()
    ds = FeatureDataset(heldout, verify=False)
    base = chain_stats(model, ds, head_w, len(ds), depth)["mean_acceptance_length"]
    rows = []
    for j in range(len(ds.manifest.point_names)):
        s = chain_stats(model, SlotShuffled(ds, j), head_w, len(ds), depth)["mean_acceptance_length"]
        rows.append({"slot": j, "point": ds.manifest.point_names[j], "mean_acceptance_length": s, "drop": base - s})
    return [{"slot": None, "point": "none shuffled", "mean_acceptance_length": base, "drop": 0.0}] + rows


def load_head_and_tokenizer(target: str = "default"):
    from eaglewire.targets.load import load_target

    t = load_target(target)
    return t.model.get_output_embeddings().weight.detach().float(), t.tokenizer


def print_rows(rows: list[dict]) -> None:
    cats = sorted(rows[0]["per_category"]) if rows else []
    print(f"{'drafter':<44}{'MAL@3':>7}  {'per position':<18}" + "".join(f"{c[:9]:>10}" for c in cats))
    for r in rows:
        pp = " ".join(f"{a:.2f}" for a in r["acceptance_rate_per_position"])
        print(f"{r['drafter'][-44:]:<44}{r['mean_acceptance_length']:>7.3f}  {pp:<18}"
              + "".join(f"{r['per_category'][c]:>10.3f}" for c in cats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafters", type=Path, nargs="+")
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--target", default="default")
    ap.add_argument("--slots", action="store_true", help="also: each slot's contribution (features shuffled over positions)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    head_w, tok = load_head_and_tokenizer(args.target)
    cats = categories(args.heldout, FeatureDataset(args.heldout, verify=False), tok)
    rows = [score(d, args.heldout, head_w, cats, args.depth) for d in args.drafters]
    print_rows(rows)
    if args.slots:
        for d, r in zip(args.drafters, rows):
            r["slots"] = slot_ablation(d, args.heldout, head_w, args.depth)
            for x in r["slots"]:
                print(f"  {str(d)[-40:]:<40} {x['point']:<16} MAL@{args.depth} {x['mean_acceptance_length']:.3f} "
                      f"(drop {x['drop']:+.3f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
