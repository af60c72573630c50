"""Held-out acceptance on the second turn of a conversation, beside the first.

Chat users mostly read second and later answers, with the first answer in the
context; the demo's held-out figure scores first answers only. This takes a
run's held-out answers (the target's own first answers to the shipped prompts,
`RUN/heldout/responses.jsonl`), appends a follow-up question to each, lets the
target answer it (`data build`, as the demo builds its held-out set), and
scores the run's drafter with the offline walk `doctor drafter` uses (chain,
ungated, 1 + accepted per round as vLLM counts it) on the second answer only
(the first answer's tokens are context, not scored), and on the first answers
alone from `RUN/heldout`.

Usage: python benchmarks/bench_multiturn.py --run runs/demo-quick [--drafter TRAIN_DIR] [--heldout DIR] [--out DIR]
       [--depth 3] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglewire.data.answers import sample_ids
from eaglewire.data.config import DataBuildConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.jsonl import read_jsonl
from eaglewire.data.lossmask import render_with_mask
from eaglewire.data.pipeline import run_build
from eaglewire.data.turns import HELDOUT_FOLLOW_UPS
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.saved.checkpoint import load_checkpoint, resolve_dir
from eaglewire.targets.load import load_target


class _SecondTurnOnly:
    """A dataset view whose loss mask covers only the last answer (earlier turns are context)."""

    def __init__(self, ds: FeatureDataset, starts: dict[int, int]):
        self.ds, self.starts = ds, starts

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        item = dict(self.ds[i])
        mask = item["loss_mask"].clone()
        mask[: self.starts[i]] = 0
        item["loss_mask"] = mask
        return item


def _second_turn_starts(tokenizer, out: Path, ds: FeatureDataset) -> dict[int, int]:
    """Where each sample's last answer begins: after the rendered prompt that ends with the follow-up."""
    rows = {r["index"]: r for r in read_jsonl(out / "responses.jsonl") if "messages" in r}
    order = [j for shard in ds.manifest.shards for j in shard["indices"]]  # the dataset's sample order
    starts = {}
    for i, idx in enumerate(order):
        row = rows[idx]
        prompt, _ = render_with_mask(tokenizer, row["messages"][:-1], add_generation_prompt=True)
        ids, _ = sample_ids(tokenizer, row)
        if ids[: len(prompt)] != prompt or ds[i]["input_ids"].tolist() != ids:
            raise SystemExit(f"sample {idx}: the stored ids are not the rendered prompt plus the answer")
        starts[i] = len(prompt)
    return starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a demo run (its heldout/ and train/drafter)")
    ap.add_argument("--drafter", type=Path, default=None, help="score this training run's drafter instead of RUN/train")
    ap.add_argument("--heldout", type=Path, default=None, help="first answers to build on (default RUN/heldout)")
    ap.add_argument("--out", type=Path, default=None, help="where the two-turn held-out set goes (default RUN/heldout-2turn)")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = a.out or a.run / "heldout-2turn"
    heldout = a.heldout or a.run / "heldout"
    first = [r for r in read_jsonl(heldout / "responses.jsonl") if "messages" in r]
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = out.parent / f"{out.name}.prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": r["messages"][:2] + [
        {"role": "user", "content": HELDOUT_FOLLOW_UPS[r["index"] % len(HELDOUT_FOLLOW_UPS)]}]}) + "\n" for r in first))
    model, prov = load_checkpoint(resolve_dir(a.drafter or a.run / "train"))
    t = load_target(prov.target.source)
    run_build(DataBuildConfig(out=out, target=prov.target.source, prompts=prompts, max_new_tokens=a.max_new_tokens,
                              batch_size=64, device="cpu", resume=out.exists()))
    head_w = t.model.get_output_embeddings().weight.detach().float()
    one = FeatureDataset(heldout)
    two = FeatureDataset(out)
    starts = _second_turn_starts(t.tokenizer, out, two)
    res = {"run": str(a.run), "drafter": str(a.drafter or a.run / "train"), "depth": a.depth,
           "first_turn": chain_stats(model, one, head_w, len(one), a.depth),
           "second_turn": chain_stats(model, _SecondTurnOnly(two, starts), head_w, len(two), a.depth)}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for k in ("first_turn", "second_turn"):
        s = res[k]
        lo, hi = s["mean_acceptance_length_ci95"] or (float("nan"), float("nan"))
        print(f"{k.replace('_', ' ')}: mean acceptance length {s['mean_acceptance_length']:.3f} (95% {lo:.2f}-{hi:.2f}), "
              f"{s['rounds']} rounds over {s['samples']} answers; per position "
              + " / ".join(f"{x:.3f}" for x in s["acceptance_rate_per_position"]))


if __name__ == "__main__":
    main()
