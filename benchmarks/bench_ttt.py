"""Time efficient vs naive TTT (forward + backward) on a small random drafter.

Usage: python benchmarks/bench_ttt.py [--seq-len 256] [--steps 7] [--json]

The naive reference runs one-token steps position by position, so its cost is
dominated by Python/launch overhead; the ratio shows what the block-mask
implementation buys, and the loss difference doubles as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

try:
    from eaglewire.drafter import DrafterConfig, Eagle3Drafter, ttt_forward, ttt_forward_naive
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from eaglewire.drafter import DrafterConfig, Eagle3Drafter, ttt_forward, ttt_forward_naive


def build(args: argparse.Namespace) -> tuple[Eagle3Drafter, dict]:
    torch.manual_seed(0)
    h, ht, v, d = args.hidden, args.hidden, args.vocab, args.vocab // 2
    cfg = DrafterConfig(
        hidden_size=h,
        intermediate_size=3 * h,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=h // 4,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        target_hidden_size=ht,
        vocab_size=v,
        draft_vocab_size=d,
    )
    model = Eagle3Drafter(cfg)
    model.load_target_embedding(torch.randn(v, h))
    model.set_draft_vocab(torch.sort(torch.randperm(v)[:d]).values)
    b, t = args.batch, args.seq_len
    attn = torch.ones(b, t, dtype=torch.long)
    attn[-1, -t // 4 :] = 0
    batch = dict(
        features=torch.randn(b, t, 3 * ht),
        input_ids=torch.randint(0, v, (b, t)),
        target_hidden=torch.randn(b, t, ht),
        target_head_weight=torch.randn(v, ht),
        loss_mask=attn.clone(),
        attention_mask=attn,
    )
    return model, batch


def time_fn(fn, model, batch, steps: int, repeats: int) -> tuple[float, float]:
    best, loss = float("inf"), float("nan")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = fn(model, steps=steps, **batch)
        out.loss.backward()
        best = min(best, time.perf_counter() - start)
        loss = float(out.loss.detach())
    return best, loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model, batch = build(args)
    time_fn(ttt_forward, model, batch, args.steps, 1)  # warm-up
    fast_s, fast_loss = time_fn(ttt_forward, model, batch, args.steps, args.repeats)
    naive_s, naive_loss = time_fn(ttt_forward_naive, model, batch, args.steps, 1)
    res = {
        "seq_len": args.seq_len,
        "steps": args.steps,
        "batch": args.batch,
        "hidden": args.hidden,
        "threads": torch.get_num_threads(),
        "efficient_s": fast_s,
        "naive_s": naive_s,
        "speedup": naive_s / fast_s,
        "loss_rel_diff": abs(fast_loss - naive_loss) / max(abs(naive_loss), 1e-12),
    }
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"T={args.seq_len} steps={args.steps} B={args.batch} H={args.hidden}: "
            f"efficient {fast_s * 1e3:.1f} ms, naive {naive_s * 1e3:.1f} ms, "
            f"speedup {res['speedup']:.1f}x, loss rel diff {res['loss_rel_diff']:.2e}"
        )


if __name__ == "__main__":
    main()
