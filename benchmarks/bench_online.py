"""Online vs offline training throughput: the target's forward in the loop vs features read from disk.

Builds one dataset (generate -> extract -> vocab) on `--target`, then trains
the same `--steps` on the same samples twice per round, interleaved: offline
(`train --data DS`, shards memory-mapped) and online (`train --online` on a
copy holding only responses.jsonl and the vocab). Reports samples/s of the
training loop (each step's fetch + forward + TTT step, from metrics.csv) and
of the whole run (target load and setup included), and the online/offline
ratio. The final losses of both are printed as well: they should match.

    python benchmarks/bench_online.py --target tiny:llama --json      # a minute on the 2-core CPU
    python benchmarks/bench_online.py --target default --samples 64 --max-new-tokens 128 --json
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

from eaglewire.data.config import DataExtractConfig, DataGenerateConfig, DataVocabConfig
from eaglewire.data.pipeline import run_extract, run_generate, run_vocab
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train

COPY = ("prompts.jsonl", "responses.jsonl", "generate.config.json", "vocab.safetensors", "vocab.json")


def build(root: Path, args) -> tuple[Path, Path]:
    """(offline dataset, online copy without features) from the same responses."""
    off = root / "offline"
    run_generate(DataGenerateConfig(out=off, target=args.target, topic_prompts=args.samples, device="cpu",
                                    max_new_tokens=args.max_new_tokens, batch_size=16))
    run_extract(DataExtractConfig(data=off, target=args.target, store_dtype=args.store_dtype, device="cpu"))
    run_vocab(DataVocabConfig(data=off, vocab_size=args.vocab_size))
    on = root / "online"
    on.mkdir()
    for name in COPY:
        shutil.copy(off / name, on / name)
    return off, on


def step_tokens(data: Path, args) -> list[int]:
    """Tokens each step trains on: a pure function of (seed, step), so the same for both runs."""
    from eaglewire.data.dataset import FeatureDataset
    from eaglewire.training.schedule import global_batch, split_indices

    ds = FeatureDataset(data, verify=False, max_len=args.max_len)
    lens = [int(ds[i]["input_ids"].numel()) for i in range(len(ds))]
    train_idx, _ = split_indices(len(ds), 0.0, 0)
    return [sum(lens[i] for i in global_batch(train_idx, s, args.batch_size, 0)) for s in range(args.steps)]


def train(data: Path, out: Path, args, online: bool, tokens: list[int]) -> dict:
    """One run; loop seconds from metrics.csv (tokens_per_s covers fetch + target forward + TTT step)."""
    kw = dict(data=data, out=out, device="cpu", max_steps=args.steps, batch_size=args.batch_size, max_len=args.max_len,
              ttt_steps=args.ttt_steps, val_fraction=0.0, save_every=10**6, warmup_steps=2)
    if online:
        kw.update(online=True, target=args.target, store_dtype=args.store_dtype)
    t0 = time.perf_counter()
    run_train(TrainConfig(**kw))
    wall = time.perf_counter() - t0
    with open(out / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    loop = sum(n / float(r["tokens_per_s"]) for n, r in zip(tokens, rows, strict=True))
    return {"wall_s": wall, "loop_s": loop, "losses": [float(r["loss"]) for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="tiny:llama")
    ap.add_argument("--samples", type=int, default=48, help="topic prompts to answer")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--store-dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="offline/online pairs, interleaved")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_online_"))
    try:
        off, on = build(root, args)
        tokens = step_tokens(off, args)
        runs = {"offline": [], "online": []}
        for r in range(args.rounds):
            order = [("offline", off), ("online", on)] if r % 2 == 0 else [("online", on), ("offline", off)]
            for name, data in order:
                runs[name].append(train(data, root / f"{name}{r}", args, name == "online", tokens))
        res = summarize(runs, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(res, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        print(text)
    else:
        for k in ("offline", "online"):
            v = res[k]
            print(f"{k:8s} loop {v['loop_samples_per_s']:.2f} samples/s  end to end {v['run_samples_per_s']:.2f} "
                  f"samples/s  final loss {v['final_loss']:.5f}")
        print(f"online/offline: loop {res['ratio_loop']:.3f}x  end to end {res['ratio_run']:.3f}x  "
              f"(max relative loss difference {res['max_rel_loss_diff']:.1e})")


def summarize(runs: dict, args) -> dict:
    samples = args.steps * args.batch_size
    out = {"target": args.target, "steps": args.steps, "batch_size": args.batch_size, "rounds": args.rounds,
           "store_dtype": args.store_dtype}
    for name, rs in runs.items():
        out[name] = {"loop_s": [r["loop_s"] for r in rs], "run_s": [r["wall_s"] for r in rs],
                     "loop_samples_per_s": samples * len(rs) / sum(r["loop_s"] for r in rs),
                     "run_samples_per_s": samples * len(rs) / sum(r["wall_s"] for r in rs),
                     "final_loss": rs[-1]["losses"][-1]}
    a, b = runs["offline"][0]["losses"], runs["online"][0]["losses"]
    out["max_rel_loss_diff"] = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    out["ratio_loop"] = out["online"]["loop_samples_per_s"] / out["offline"]["loop_samples_per_s"]
    out["ratio_run"] = out["online"]["run_samples_per_s"] / out["offline"]["run_samples_per_s"]
    return out


if __name__ == "__main__":
    main()
