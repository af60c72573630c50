"""Feature storage dtype, measured: fp32 vs bf16 vs fp16 on the same answers.

The features are the largest artifact of the offline path (P+1 vectors of H
per token), so the storage dtype sets the disk bill. Whether halving it costs
drafter quality is a question for a measurement, not an argument: this script
generates the target's answers once, extracts them three times (same target,
same points, only `--store-dtype` differs), trains one drafter per copy with
the same seed, steps and options, and reports bytes per token (from the shard
files), how far each copy is from the fp32 features, and validation loss and
acc_0 (the training log's acc: in-draft-vocab positions).

    OMP_NUM_THREADS=1 python benchmarks/bench_storage.py --target default --topic-prompts 96 \\
        --max-new-tokens 96 --steps 150 --out runs/storage --json runs/storage/storage.json

Stages already done in --out are kept (delete the directory to start over).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from safetensors import safe_open

from eaglewire.data.config import DataExtractConfig, DataGenerateConfig, DataVocabConfig
from eaglewire.data.manifest import read_manifest
from eaglewire.data.pipeline import run_extract, run_generate, run_vocab
from eaglewire.targets.load import load_target
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train

DTYPES = ("fp32", "bf16", "fp16")
# the quick demo's training options (src/eaglewire/demo/run.py), with a fixed step budget
TRAIN = dict(batch_size=2, lr=3e-3, max_len=512, ttt_steps=5, init="target", freeze_head=True, seed=0,
             save_every=100000, val_fraction=0.1)


def generate_once(args) -> Path:
    gen = args.out / "responses"
    if not (gen / "generate.config.json").exists():
        run_generate(DataGenerateConfig(out=gen, target=args.target, topic_prompts=args.topic_prompts,
                                        max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch, seed=0,
                                        device=args.device, resume=(gen / "responses.jsonl").exists()))
    return gen


def extract_copy(args, gen: Path, dtype: str, target) -> tuple[Path, float]:
    d = args.out / f"data-{dtype}"
    if (d / "vocab.safetensors").exists() and read_manifest(d).get("complete"):
        return d, float("nan")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("prompts.jsonl", "responses.jsonl", "generate.config.json"):
        shutil.copy(gen / name, d / name)
    t0 = time.perf_counter()
    run_extract(DataExtractConfig(data=d, target=args.target, device=args.device, store_dtype=dtype,
                                  resume=(d / "manifest.json").exists()), target)
    secs = time.perf_counter() - t0
    run_vocab(DataVocabConfig(data=d))
    return d, secs


def shard_stats(d: Path) -> dict:
    man = read_manifest(d)
    files = [d / e["file"] for e in man["shards"]]
    total = sum(f.stat().st_size for f in files)
    feat = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in ("features", "target_hidden"):
                feat += _numel(h.get_slice(k).get_shape())
    return {"num_tokens": man["num_tokens"], "shard_bytes": total, "bytes_per_token": total / man["num_tokens"],
            "feature_values_per_token": feat / man["num_tokens"]}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _tensors(d: Path, key: str) -> torch.Tensor:
    man = read_manifest(d)
    out = []
    for e in man["shards"]:
        with safe_open(str(d / e["file"]), framework="pt") as h:
            out.append(h.get_tensor(key).double().flatten(1))
    return torch.cat(out)


def error_vs_fp32(d: Path, ref: Path) -> dict:
    """Relative RMS error and max |x| of the stored copy against the fp32 copy (same tokens, same order)."""
    res = {}
    for key in ("features", "target_hidden"):
        a, r = _tensors(d, key), _tensors(ref, key)
        fin = torch.isfinite(a)
        err = ((a - r)[fin] ** 2).sum() / (r[fin] ** 2).sum()
        res[key] = {"rel_rms_err": float(err.sqrt()), "nonfinite": int((~fin).sum()), "max_abs_fp32": float(r.abs().max())}
    return res


def train_copy(args, d: Path, dtype: str) -> dict:
    out = args.out / f"train-{dtype}"
    done = out / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    if out.exists():
        shutil.rmtree(out)  # an interrupted run: redo it whole so every dtype trains the same way
    t0 = time.perf_counter()
    res = run_train(TrainConfig(data=d, out=out, max_steps=args.steps, device=args.device, **TRAIN))
    res["train_seconds"] = time.perf_counter() - t0
    done.write_text(json.dumps(res, indent=2))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default")
    ap.add_argument("--topic-prompts", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per dtype (same for all)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("runs/storage"))
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = generate_once(args)
    target = load_target(args.target, device=torch.device(args.device))
    dirs, rows = {}, []
    for dt in DTYPES:
        dirs[dt], secs = extract_copy(args, gen, dt, target)
        print(f"[storage] extracted {dt} in {secs:.1f} s", flush=True)
    del target
    for dt in DTYPES:
        res = train_copy(args, dirs[dt], dt)
        v = res["validation"]
        rows.append({"dtype": dt, **shard_stats(dirs[dt]), "error_vs_fp32": error_vs_fp32(dirs[dt], dirs["fp32"]),
                     "val_loss": v["loss"], "val_acc": v["acc"], "steps": res["steps"],
                     "train_seconds": res.get("train_seconds")})
    print(f"{'dtype':<6}{'bytes/tok':>11}{'vs fp32':>9}{'feat rel err':>14}{'nonfinite':>11}{'val loss':>10}"
          f"{'acc_0':>8}{'acc_1':>8}")
    base = rows[0]["bytes_per_token"]
    for r in rows:
        e = r["error_vs_fp32"]["features"]
        print(f"{r['dtype']:<6}{r['bytes_per_token']:>11.0f}{r['bytes_per_token'] / base:>9.2f}{e['rel_rms_err']:>14.2e}"
              f"{e['nonfinite']:>11}{r['val_loss']:>10.4f}{r['val_acc'][0]:>8.4f}{r['val_acc'][1]:>8.4f}")
    result = {"settings": {**vars(args), "train": TRAIN}, "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
