"""Time TTT (forward + backward): split attention vs block mask vs naive reference.

Usage:
    python benchmarks/bench_ttt.py [--seq-len 256] [--steps 7] [--threads 1] [--json]
    python benchmarks/bench_ttt.py --preset default [--seq-lens 512 1024] [--threads 1] [--json]

Three implementations of the same loss, timed on the same random drafter and
batch (forward + backward of the whole unrolled TTT pass):

* ``efficient``: :func:`ttt_forward` (per-step K/V lists, one causal attention
  with its log-sum-exp plus per-position diagonal scores per step);
* ``blockmask``: :func:`ttt_forward_blockmask` (the previous implementation:
  re-concatenated KV cache, SDPA over all (k+1)T keys with the block mask
  [causal | eye * k]);
* ``naive``: :func:`ttt_forward_naive` (one-token steps position by position;
  only in the small preset, it is far too slow at T=1024).

``--preset default`` uses the default target's shapes (SmolLM2-135M: H=576,
9 / 3 heads of 64, intermediate 1536, vocab 49,152, draft vocab 8192, 3 aux
layers, batch 1, 7 steps) at ``--seq-lens``. Repeats alternate between the
implementations so load from other users of the machine hits both; the best
time is reported, with ``blockmask / efficient`` as the speedup, and the
relative loss and max gradient differences double as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from eaglewire.drafter import Eagle3Drafter  # noqa: E402
from eaglewire.drafter.ttt import ttt_forward, ttt_forward_naive  # noqa: E402
from eaglewire_testing.drafters import make_batch, make_model  # noqa: E402
from eaglewire_testing.ttt_blockmask import ttt_forward_blockmask  # noqa: E402

PRESETS = {
    # hidden, heads, kv heads, head_dim, intermediate, vocab, draft vocab, target hidden, batch
    "small": None,  # from --hidden / --vocab / --batch
    "default": dict(
        hidden=576,
        heads=9,
        kv_heads=3,
        head_dim=64,
        intermediate=1536,
        vocab=49152,
        draft=8192,
        target_hidden=576,
        batch=1,
    ),
}


def shapes(args: argparse.Namespace) -> dict:
    if args.preset == "default":
        return dict(PRESETS["default"])
    h = args.hidden
    return dict(
        hidden=h,
        heads=4,
        kv_heads=2,
        head_dim=h // 4,
        intermediate=3 * h,
        vocab=args.vocab,
        draft=args.vocab // 2,
        target_hidden=h,
        batch=args.batch,
    )


def build(s: dict, seq_len: int) -> tuple[Eagle3Drafter, dict]:
    model = make_model(
        seed=0, dtype=torch.float32, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
        max_position_embeddings=4096, target_hidden_size=s["target_hidden"], vocab_size=s["vocab"],
        draft_vocab_size=s["draft"],
    )
    batch = make_batch(s["batch"], seq_len, seed=0, dtype=torch.float32, vocab=s["vocab"], target_hidden=s["target_hidden"])
    return model, batch


def run_once(fn, model, batch, steps: int) -> tuple[float, float, dict]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    out = fn(model, steps=steps, **batch)
    out.loss.backward()
    elapsed = time.perf_counter() - start
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return elapsed, float(out.loss.detach()), grads


def max_grad_rel_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp(min=1e-30)) for n in b)


def bench(args: argparse.Namespace, s: dict, seq_len: int) -> dict:
    model, batch = build(s, seq_len)
    impls = {"efficient": ttt_forward, "blockmask": ttt_forward_blockmask}
    best = {name: float("inf") for name in impls}
    losses, grads = {}, {}
    for fn in impls.values():  # warm-up
        run_once(fn, model, batch, args.steps)
    for _ in range(args.repeats):
        for name, fn in impls.items():
            t, loss, g = run_once(fn, model, batch, args.steps)
            best[name] = min(best[name], t)
            losses[name], grads[name] = loss, g
    res = {
        "preset": args.preset,
        "seq_len": seq_len,
        "steps": args.steps,
        "batch": s["batch"],
        "hidden": s["hidden"],
        "heads": f"{s['heads']}/{s['kv_heads']}x{s['head_dim']}",
        "draft_vocab": s["draft"],
        "threads": torch.get_num_threads(),
        "efficient_s": best["efficient"],
        "blockmask_s": best["blockmask"],
        "efficient_ms_per_step": best["efficient"] / args.steps * 1e3,
        "blockmask_ms_per_step": best["blockmask"] / args.steps * 1e3,
        "speedup_vs_blockmask": best["blockmask"] / best["efficient"],
        "loss_rel_diff_blockmask": abs(losses["efficient"] - losses["blockmask"])
        / max(abs(losses["blockmask"]), 1e-12),
        "grad_max_rel_diff_blockmask": max_grad_rel_diff(grads["efficient"], grads["blockmask"]),
    }
    if args.naive:
        naive_s, naive_loss, _ = run_once(ttt_forward_naive, model, batch, args.steps)
        res["naive_s"] = naive_s
        res["speedup_vs_naive"] = naive_s / best["efficient"]
        res["loss_rel_diff_naive"] = abs(losses["efficient"] - naive_loss) / max(
            abs(naive_loss), 1e-12
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--seq-len", type=int, default=None, help="one length (small: 256)")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, help="(default: 512 1024)")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=2, help="small preset only")
    ap.add_argument("--hidden", type=int, default=128, help="small preset only")
    ap.add_argument("--vocab", type=int, default=2000, help="small preset only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument(
        "--naive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time the naive reference (default: small preset only)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.naive is None:
        args.naive = args.preset == "small"
    if args.seq_lens:
        lens = args.seq_lens
    elif args.seq_len:
        lens = [args.seq_len]
    else:
        lens = [256] if args.preset == "small" else [512, 1024]
    s = shapes(args)
    results = [bench(args, s, t) for t in lens]
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0]))
        return
    for r in results:
        line = (
            f"[{r['preset']}] T={r['seq_len']} steps={r['steps']} B={r['batch']} H={r['hidden']} "
            f"heads={r['heads']} D={r['draft_vocab']} threads={r['threads']}: "
            f"efficient {r['efficient_s'] * 1e3:.0f} ms ({r['efficient_ms_per_step']:.0f}/step), "
            f"blockmask {r['blockmask_s'] * 1e3:.0f} ms ({r['blockmask_ms_per_step']:.0f}/step), "
            f"speedup {r['speedup_vs_blockmask']:.2f}x, "
            f"loss rel diff {r['loss_rel_diff_blockmask']:.1e}, "
            f"grad max rel diff {r['grad_max_rel_diff_blockmask']:.1e}"
        )
        if "naive_s" in r:
            line += f"; naive {r['naive_s'] * 1e3:.0f} ms ({r['speedup_vs_naive']:.1f}x slower)"
        print(line)


if __name__ == "__main__":
    main()
