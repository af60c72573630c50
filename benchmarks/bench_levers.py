"""Drafter-quality levers: held-out mean acceptance length per CPU-minute, one training run per variant.

Every variant trains on the same dataset (`--data`, made with `eaglewire data
build`) with the same seed, starting from the demo presets' training recipe,
then is scored by `bench_heldout.py` on a dataset built from the shipped
held-out prompts (`--heldout`): mean acceptance length at chain depth 3,
ungated, as vLLM reports it, per position and per prompt category.

    eaglewire data build --target default --prompts src/eaglewire/bench_prompts/heldout.jsonl \\
        --max-new-tokens 160 --gen-batch-size 54 --out runs/heldout160
    python benchmarks/bench_levers.py --data runs/demo-quick/data --heldout runs/heldout160 --out runs/levers \\
        --variant base: --variant noise:feature_noise=0.1 --variant two_layers:num_layers=2 --json

A variant is NAME:key=value,... over `eaglewire train` options. Runs are
sequential (one at a time: a second heavy job distorts the CPU-minutes). A
variant whose drafter exists under --out is scored again, not retrained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from bench_heldout import categories, load_head_and_tokenizer, print_rows, score

from eaglewire.data.dataset import FeatureDataset
from eaglewire.infra.options import config_from_dict
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train


def base_options() -> dict:
    """The quick preset's training recipe, read from the demo (one definition), on CPU."""
    from pathlib import Path as _P

    from eaglewire.demo.commands import demo_steps
    from eaglewire.demo.config import PRESETS

    train = next(s.config for s in demo_steps("default", PRESETS["quick"], _P("x")) if s.command == "train")
    keep = ("epochs", "batch_size", "lr", "max_len", "ttt_steps", "lk_weight", "init", "freeze_head", "fc_norm",
            "val_fraction", "seed", "feature_noise")
    return {**{k: getattr(train, k) for k in keep}, "device": "cpu", "save_every": 100000}


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
                  else float(v) if typ == "float" else Path(v) if "Path" in typ else v)
    return name, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME:key=value,... (train options)")
    ap.add_argument("--depth", type=int, default=3, help="chain depth of the held-out acceptance length")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    head_w, tok = load_head_and_tokenizer()
    cats = categories(args.heldout, FeatureDataset(args.heldout, verify=False), tok)
    rows = []
    for v in args.variant:
        name, kw = parse_variant(v)
        out = args.out / name
        opts = {**base_options(), **kw, "data": kw.get("data", args.data), "out": out}
        cfg = config_from_dict(TrainConfig, opts)
        done = out / "result.json"
        recorded = json.loads(done.read_text()).get("options", "unrecorded") if done.exists() else None
        same = done.exists() and recorded in ("unrecorded", {k: str(v) for k, v in opts.items()})  # older runs: trusted
        if done.exists() and not same:
            raise SystemExit(f"{out}: trained with other options than variant {name!r} now gives; remove it or rename the variant")
        if same:
            res = json.loads(done.read_text())
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            r = run_train(cfg)
            res = {"steps": r["steps"], "val_acc": r["validation"]["acc"], "train_wall_min": (time.perf_counter() - t0) / 60,
                   "train_cpu_min": (time.process_time() - c0) / 60, "options": {k: str(v) for k, v in opts.items()}}
            done.write_text(json.dumps(res))
        s = score(out / "drafter", args.heldout, head_w, cats, args.depth)
        rows.append({"variant": name, "options": {k: str(v) for k, v in kw.items()}, **res, **s, "drafter": name})
    print_rows(rows)
    print(f"{'variant':<20}{'steps':>6}{'wall min':>9}{'val acc_0':>10}{'MAL@3':>7}")
    for r in rows:
        print(f"{r['variant']:<20}{r['steps']:>6}{r['train_wall_min']:>9.1f}{r['val_acc'][0]:>10.3f}"
              f"{r['mean_acceptance_length']:>7.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "levers.json").write_text(json.dumps(rows, indent=2))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
