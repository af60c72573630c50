"""Microbenchmarks for speculative decoding on the default target (CPU).

Usage: python benchmarks/bench_decoding.py [--target default] [--context 200] [--repeats 5] [--json]

Measures, against a KV cache of --context tokens:
* decode step: transformers forward of 1 token with full logits (what
  ``generate`` pays per token);
* verify of N tokens (N = 1, 4, 8, 16, 32, 64):
  - hf: transformers forward of N tokens with full logits at all N rows;
  - hf base: the decoder stack without any lm_head;
  - onednn / kernel / lean: eaglewire TargetRunner with oneDNN-prepacked
    linears, without / with the thin-matrix kernel for 1..16 rows, both
    through transformers' forward; lean-ops = the kernel under the lean
    forward's tensor ops (targets/lean.py, the fallback), lean = one C++ call
    per layer around the kernel (kernels/lean_layer.cpp, what the engine
    runs); + logits at the rows a greedy
    walk typically needs (min(N, 6)); "x step" is that time over the same
    variant's N = 1 (our own plain decode step);
* drafting: one round of a random EAGLE-3 drafter sized for the target (an
  8192-token draft vocabulary, as the demo builds): extend by 2 accepted
  tokens plus a top_k 3 / depth 2 tree, with the model's own step on MKL,
  on the kernel, and as one C++ call per layer (decoding/draft_lean.py).
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

import eaglewire.targets.smallm as smallm
from eaglewire.decoding.draft import DraftRunner
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.targets.lean import LeanStack
from eaglewire.targets.load import load_target
from eaglewire.targets.points import eagle3_default

SIZES = (1, 4, 8, 16, 32, 64)


def median_ms(fn, repeats: int, before=None) -> float:
    """Median of ``repeats`` timed calls after one warm-up; ``before()`` runs untimed ahead of each."""
    fn()
    ts = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1000, 2)


def _use_kernel(model, on: bool) -> None:
    """Switch the thin-matrix kernel on or off for the runners built next (drops cached FastLinears)."""
    smallm._STATE.clear()
    if not on:
        smallm._STATE.update(mod=None, why="off for this variant")
    for mod in model.modules():
        if hasattr(mod, "_eaglewire_fast"):
            object.__delattr__(mod, "_eaglewire_fast")


def _timings(target, ids, context: int, repeats: int, variant: str) -> dict:
    """``variant``: hf (transformers forward, full logits), onednn (our runner, oneDNN packs), kernel (our
    runner with the thin-matrix kernel). Ours: forward + logits at the rows a greedy walk needs (min(N, 6))."""
    model = target.model
    _use_kernel(model, variant in ("kernel", "lean", "lean-ops"))
    runner = TargetRunner(target, eagle3_default(target.num_layers), fast=True)
    if variant not in ("lean", "lean-ops"):
        runner.lean_why = "off for this variant"
    elif variant == "lean-ops":
        runner._lean = LeanStack(runner.base, target.model.config)
        runner._lean.fused = None
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

    if variant == "hf":
        return {"decode_step": median_ms(lambda: hf(1), repeats),
                "before": {n: median_ms(lambda n=n: hf(n), repeats) for n in SIZES},
                "base_only": {n: median_ms(lambda n=n: hf(n, False), repeats) for n in SIZES}}
    return {variant: {n: median_ms(lambda n=n: ours(n), repeats) for n in SIZES}}


def bench_target(target, context: int, repeats: int) -> dict:
    """Variants interleaved round by round, so a slow patch of the machine hits each alike."""
    ids = torch.randint(0, target.vocab_size, (1, context + max(SIZES)))
    variants = ["hf", "onednn"] + (["kernel", "lean-ops", "lean"] if smallm.unavailable_reason() is None else [])
    rounds = [{v: _timings(target, ids, context, repeats, v) for v in variants} for _ in range(2)]
    res: dict = {"kernel_available": "kernel" in variants, "kernel_note": smallm.unavailable_reason()}
    for v in variants:  # the better of the two rounds, per entry
        for key, val in rounds[0][v].items():
            other = rounds[1][v][key]
            res[key] = ({n: min(val[n], other[n]) for n in val} if isinstance(val, dict) else min(val, other))
    for v in ("onednn", "kernel", "lean-ops", "lean"):
        if v in res:
            res[f"{v}_vs_own_step"] = {n: round(res[v][n] / res[v][1], 3) for n in SIZES}
    return res


# model step on MKL / on the kernel / one C++ call per layer / + bf16 / + int8 rows
WAYS = ("model", "kernel", "lean", "lean-bf16", "lean-int8")


def bench_drafter(target, context: int, repeats: int, draft_vocab: int = 8192, evict_mb: int = 0) -> dict:
    """One round's drafting on a random drafter sized for the target: an extend by 2 accepted tokens and a
    tree of the CPU default shape (top_k 3, depth 2, 7 tokens, every level expanded), five ways.

    With ``evict_mb``, a buffer that large is read before every timed round (untimed), as the target's
    forward evicts the drafter's weights between two rounds in decoding; without it they stay in cache."""
    d = min(draft_vocab, target.vocab_size)
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=d)
    dr = Eagle3Drafter(cfg).eval()
    width = cfg.num_aux * cfg.target_hidden_size
    g = torch.Generator().manual_seed(0)
    ids, feats = torch.randint(0, d, (1, 2), generator=g), torch.randn(1, 2, width, generator=g)
    res: dict = {"draft_vocab": d, "evict_mb": evict_mb}
    buf = torch.ones(evict_mb * (1 << 18)) if evict_mb else None  # evict_mb MB of fp32
    evict = (lambda: buf.sum()) if buf is not None else None

    for way in WAYS:
        run = DraftRunner(dr, fast=way != "model", weights=way.removeprefix("lean-") if "-" in way else "fp32")
        if way == "kernel":
            run.lean = None
        elif way.startswith("lean") and run.lean is None:
            res[way] = "not built here"
            continue
        run.extend(torch.randint(0, d, (1, context), generator=g), torch.randn(1, context, width, generator=g))

        def extend(run=run):
            run.extend(ids, feats)
            run.length -= 2  # the context stays at --context rows

        def whole(run=run):
            extend(run)
            run.tree(7, 3, 2, 7, 0.0)

        ext = median_ms(extend, repeats, evict)
        tree = median_ms(lambda run=run: run.tree(7, 3, 2, 7, 0.0), repeats, evict)
        res[way] = {"extend_T2": ext, "tree_3x2": tree, "round": median_ms(whole, repeats, evict)}
    return res


def _print_drafting(dm: dict) -> None:
    evict = f", {dm['evict_mb']} MB read between rounds" if dm["evict_mb"] else ", weights left in cache"
    print(f"drafting one round (draft vocab {dm['draft_vocab']}{evict}): extend 2 + tree 3x2, ms")
    for way in WAYS:
        print(f"  {way:<9} {dm[way]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--drafter-only", action="store_true", help="only the drafting round (skips the target's steps)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--evict-mb", type=int, default=512,
                    help="MB read between drafting rounds, as the target's forward does in decoding (0 = none)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target)
    res = {"target": args.target, "context": args.context, "threads": torch.get_num_threads(),
           "drafter_ms": bench_drafter(target, args.context, args.repeats, args.draft_vocab, args.evict_mb)}
    if not args.drafter_only:
        res["target_ms"] = bench_target(target, args.context, args.repeats)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    _print_drafting(res["drafter_ms"])
    if args.drafter_only:
        return
    t = res["target_ms"]
    print(f"target {args.target}, context {args.context}, {res['threads']} threads; transformers decode step "
          f"{t['decode_step']} ms; ours: forward + logits at min(N, 6) rows")
    cols = [c for c in ("onednn", "kernel", "lean-ops", "lean") if c in t]
    print(f"{'N':>4} {'hf':>8} {'hf base':>8} " + " ".join(f"{c:>8} {'x step':>7}" for c in cols))
    for n in SIZES:
        print(f"{n:>4} {t['before'][n]:>8} {t['base_only'][n]:>8} "
              + " ".join(f"{t[c][n]:>8} {t[c + '_vs_own_step'][n]:>7}" for c in cols))
    if not t["kernel_available"]:
        print(f"thin-matrix kernel not measured: {t['kernel_note']}")


if __name__ == "__main__":
    main()
