"""Drafter-quality levers: held-out tau per CPU-minute, one training run per variant.

Every variant trains on the same dataset (`--data`, made with `eaglewire data
build`) with the same seed and budget, then is scored on a dataset built from
the shipped held-out prompts (`--heldout`: the target's own greedy answers to
prompts no training set uses). On greedy answers the offline chain tau is what
chain decoding would accept while serving those prompts: while drafts match,
the drafter's own tokens equal the answer's tokens.

    eaglewire data build --target default --prompts src/eaglewire/bench_prompts/heldout.jsonl \\
        --max-new-tokens 160 --batch-size 64 --out runs/heldout
    eaglewire data build --target default --topic-prompts 640 --max-new-tokens 160 --batch-size 64 --out runs/topic640
    python benchmarks/bench_levers.py --data runs/topic640 --heldout runs/heldout --out runs/levers \\
        --variant base: --variant fc_norm:fc_norm=1 --variant target:fc_norm=1,init=target,freeze_head=1 --json

A variant is NAME:key=value,... over `eaglewire train` options. Runs are
sequential (one at a time: a second heavy job distorts the CPU-minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.doctor.drafter import chain_stats
from eaglewire.drafter.checkpoint import load_checkpoint
from eaglewire.infra.options import config_from_dict
from eaglewire.target.load import load_target
from eaglewire.training.cli import TrainConfig
from eaglewire.training.loop import run_train

BASE = dict(epochs=1, batch_size=2, lr=3e-3, max_len=512, ttt_steps=5, device="cpu", save_every=100000,
            val_fraction=0.05, seed=0)


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, kv = text.partition(":")
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = {}
    for item in filter(None, kv.split(",")):
        k, _, v = item.partition("=")
        if k not in fields:
            raise SystemExit(f"--variant {text!r}: unknown train option {k!r}")
        typ = str(fields[k].type)
        out[k] = (v in ("1", "true", "True") if typ == "bool" else int(v) if typ == "int"
                  else float(v) if typ == "float" else v)
    return name, out


def score(ckpt: Path, heldout: Path, head_w: torch.Tensor, depth: int) -> dict:
    model, _ = load_checkpoint(ckpt)
    ds = FeatureDataset(heldout, verify=False)
    return chain_stats(model, ds, head_w, len(ds), depth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME:key=value,... (train options)")
    ap.add_argument("--depth", type=int, default=5, help="chain depth of the held-out tau")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    head_w = load_target("default").model.get_output_embeddings().weight.detach().float()
    rows = []
    for v in args.variant:
        name, kw = parse_variant(v)
        cfg = config_from_dict(TrainConfig, {**BASE, **kw, "data": args.data, "out": args.out / name})
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_train(cfg)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = score(args.out / name / "drafter", args.heldout, head_w, args.depth)
        rows.append({"variant": name, "options": kw, "steps": res["steps"], "train_wall_min": wall / 60,
                     "train_cpu_min": cpu / 60, "val_acc": res["validation"]["acc"], "heldout_acc": s["acc"],
                     "heldout_tau_chain": s["tau_chain"]})
    base = rows[0]
    for r in rows:
        r["tau_gain_per_cpu_min_vs_first"] = (r["heldout_tau_chain"] - base["heldout_tau_chain"]) / max(
            r["train_cpu_min"], 1e-9) if r is not base else 0.0
    print(f"{'variant':<14}{'steps':>6}{'cpu min':>9}{'acc_0':>7}{'acc_1':>7}{'tau(chain)':>11}")
    for r in rows:
        print(f"{r['variant']:<14}{r['steps']:>6}{r['train_cpu_min']:>9.1f}{r['heldout_acc'][0]:>7.3f}"
              f"{r['heldout_acc'][1]:>7.3f}{r['heldout_tau_chain']:>11.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "levers.json").write_text(json.dumps(rows, indent=2))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
