"""Microbenchmarks for speculative decoding on the default target (CPU).

Usage: python benchmarks/bench_decoding.py [--target default] [--context 200] [--repeats 5] [--json]

Measures, against a KV cache of --context tokens:
* decode step: transformers forward of 1 token with full logits (what
  ``generate`` pays per token);
* verify of N tokens (N = 1, 4, 8, 16, 32, 64):
  - before: transformers forward of N tokens with full logits at all N rows;
  - base only: the decoder stack without any lm_head (lower bound);
  - after: eaglewire TargetRunner (optionally oneDNN-prepacked decoder linears)
    + logits at the rows a greedy walk typically needs (min(N, 6));
* drafter step: a random EAGLE-3 drafter sized for the target, T = 1 and
  T = top_k tokens, plus its draft-vocab head.
Medians of --repeats runs; timings vary ~15% on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    import eaglewire  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.drafter.model import causal_mask
from eaglewire.targets.load import load_target
from eaglewire.targets.points import eagle3_default

SIZES = (1, 4, 8, 16, 32, 64)


def median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1000, 2)


def _timings(target, ids, context: int, repeats: int, packed: bool) -> dict:
    model = target.model
    runner = TargetRunner(target, eagle3_default(target.num_layers), fast=packed)
    runner.forward(ids[:, :context])
    cache = runner.cache

    def hf(n, full=True):
        with torch.inference_mode():
            x = ids[:, context : context + n]
            if full:
                model(input_ids=x, cache=cache, use_cache=True)
            else:
                runner.base(input_ids=x, cache=cache, use_cache=True)
        cache.crop(-n)

    def ours(n):
        h, _ = runner.forward(ids[:, context : context + n])
        runner.logits(h[0, : min(n, 6)])
        cache.crop(-n)

    res = {"after_packed" if packed else "after": {n: median_ms(lambda n=n: ours(n), repeats) for n in SIZES}}
    if not packed:
        res["decode_step"] = median_ms(lambda: hf(1), repeats)
        res["before"] = {n: median_ms(lambda n=n: hf(n), repeats) for n in SIZES}
        res["base_only"] = {n: median_ms(lambda n=n: hf(n, False), repeats) for n in SIZES}
    return res


def bench_target(target, context: int, repeats: int) -> dict:
    ids = torch.randint(0, target.vocab_size, (1, context + max(SIZES)))
    return {**_timings(target, ids, context, repeats, False), **_timings(target, ids, context, repeats, True)}


def bench_drafter(target, context: int, repeats: int, top_k: int = 4) -> dict:
    d = min(32000, target.vocab_size)
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=d)
    dr = Eagle3Drafter(cfg).eval()
    h = target.hidden_size
    with torch.inference_mode():
        feats = torch.randn(1, context, 3 * h)
        _, kv = dr.step(torch.zeros(1, context, dtype=torch.long), dr.project(feats),
                        torch.arange(context)[None], None, causal_mask(context))

        def step(t):
            dr.step(torch.zeros(1, t, dtype=torch.long), torch.randn(1, t, h),
                    torch.full((1, t), context), kv, torch.ones(1, 1, t, context + t, dtype=torch.bool))

        x = torch.randn(1, top_k, h)
        return {"draft_vocab": d, "step_T1": median_ms(lambda: step(1), repeats),
                f"step_T{top_k}": median_ms(lambda: step(top_k), repeats),
                "head_T1": median_ms(lambda: dr.logits(x[:, :1]), repeats),
                f"head_T{top_k}": median_ms(lambda: dr.logits(x), repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target)
    res = {"target": args.target, "context": args.context, "threads": torch.get_num_threads(),
           "target_ms": bench_target(target, args.context, args.repeats),
           "drafter_ms": bench_drafter(target, args.context, args.repeats)}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    t = res["target_ms"]
    print(f"target {args.target}, context {args.context}, {res['threads']} threads; decode step {t['decode_step']} ms")
    print(f"{'N':>4} {'before':>9} {'base only':>10} {'after':>9} {'after+pack':>11}")
    for n in SIZES:
        print(f"{n:>4} {t['before'][n]:>9} {t['base_only'][n]:>10} {t['after'][n]:>9} {t['after_packed'][n]:>11}")
    print("drafter:", res["drafter_ms"])


if __name__ == "__main__":
    main()
