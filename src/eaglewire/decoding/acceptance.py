"""The offline acceptance walk: greedy chain rounds replayed along stored answers, as an engine would run them.

One definition, used by `doctor drafter`, the held-out stage, `doctor live --data` and
`train --select`, so every offline figure counts rounds the same way (tau includes the
bonus token). It lives beside decoding because it is decoding's metric replayed offline,
and training (which selects checkpoints by it) may import decoding but not doctor."""

from __future__ import annotations

import torch

from eaglewire.data.dataset import collate
from eaglewire.drafter.ttt import shift_left, target_full_argmax, ttt_attention_mask


@torch.no_grad()
def unroll_predictions(model, batch: dict, head_w: torch.Tensor, depth: int):
    """Draft argmax (draft ids) per depth k at every position t, and the target argmax at t+1+k.

    Runs on the drafter's device (training selects checkpoints on CUDA with it); the results come back on the CPU.
    """
    dev = next(model.parameters()).device
    feats = batch["features"].to(dev).float().flatten(2)  # [B, T, P*H]
    ids = batch["input_ids"].to(dev)
    B, T = ids.shape
    if "target_argmax" in batch:  # the trainer's cache: the full-vocab argmax is already known
        tgt = batch["target_argmax"].to(dev)  # [B, T]
    else:
        tgt = target_full_argmax(batch["target_hidden"].to(dev).float(), head_w.to(dev))  # [B, T]
    valid = (batch["loss_mask"] & batch["attention_mask"]).to(dev)  # [B, T]
    hidden = model.project(feats)
    cache, preds, targets, masks = None, [], [], []
    for k in range(depth):
        pos = torch.arange(T, device=dev)[None] + k
        hidden, new_kv = model.step(shift_left(ids, 1 + k), hidden, pos, cache, ttt_attention_mask(T, k, dev))
        cache = new_kv if cache is None else [(torch.cat([a, c], 2), torch.cat([b, d], 2)) for (a, b), (c, d) in zip(cache, new_kv)]
        preds.append(model.logits(hidden).argmax(-1))  # [B, T] draft ids
        targets.append(shift_left(tgt, 1 + k))
        masks.append(shift_left(valid.long(), 1 + k).bool())
    return (torch.stack(preds, -1).cpu(), torch.stack(targets, -1).cpu(),  # [B, T, depth]
            torch.stack(masks, -1).cpu())


def chain_stats(model, ds, head_w, num_samples: int, depth: int, d2t_mode: str = "offsets",
                indices: list[int] | None = None, per_sample: bool = False) -> dict:
    """acc per depth and offline chain tau (accept + 1 bonus) on ``indices`` (default: the first samples).

    acc_k's denominator is every loss position whose target exists (as SpecForge
    and official EAGLE-3 count it): a target token outside the draft vocab
    counts as a miss. ``per_sample`` adds each sample's (accepted drafts, rounds) in ``indices`` order, what
    :func:`paired_interval` compares two drafters by.
    """
    correct = torch.zeros(depth)
    count = torch.zeros(depth)
    accept_lengths, rounds = [], []
    idx = list(range(len(ds)) if indices is None else indices)[:num_samples]
    for i in range(0, len(idx), 4):
        b = collate([ds[j] for j in idx[i:i + 4]])
        pred, tgt, m = unroll_predictions(model, b, head_w, depth)
        d2t = model.d2t.cpu()
        mapped = pred + d2t[pred] if d2t_mode == "offsets" else d2t[pred]
        hit = (mapped == tgt) & m  # [B, T, depth]
        correct += hit.sum(dim=(0, 1)).float()
        count += m.sum(dim=(0, 1)).float()
        start = m[..., 0]  # positions where a draft round could start
        run = torch.cumprod(hit.long(), dim=-1).sum(-1)  # [B, T] leading matches
        accept_lengths += run[start].tolist()
        served, walk = round_masks(b, depth)
        run_served = torch.cumprod((hit & served).long(), dim=-1).sum(-1)  # [B, T]
        for r_b, s_b in zip(run_served, walk):
            rounds.append(decode_rounds(r_b, s_b))
    acc = (correct / count.clamp(min=1)).tolist()
    hist = torch.bincount(torch.tensor(accept_lengths or [0]), minlength=depth + 1).tolist()
    tau = 1.0 + (sum(accept_lengths) / len(accept_lengths) if accept_lengths else 0.0)
    flat = [r for per in rounds for r in per]
    n_r = max(len(flat), 1)
    extra = {"per_sample": [[sum(r), len(r)] for r in rounds]} if per_sample else {}
    return {**extra, "acc": acc, "tau_chain": tau, "depth": depth, "accept_hist": hist, "positions": len(accept_lengths),
            "samples": len(idx),
            # as vLLM reports a served drafter: 1 + accepted per verify round, rounds taken as decoding takes them
            "mean_acceptance_length": 1.0 + sum(flat) / n_r, "rounds": len(flat),
            "mean_acceptance_length_ci95": bootstrap_interval(rounds),
            "accepted_per_position": [sum(r > k for r in flat) for k in range(depth)],
            "acceptance_rate_per_position": [sum(r > k for r in flat) / n_r for k in range(depth)]}


def rounds_summary(rounds: list[list[int]], depth: int) -> dict:
    """vLLM's figures from accepted drafts per round, per answer: 1 + accepted per round, per position, the 95%
    interval (the offline walks of every drafter kind report the same keys)."""
    flat = [r for per in rounds for r in per]
    n_r = max(len(flat), 1)
    return {"depth": depth, "samples": len(rounds), "rounds": len(flat), "per_sample": [[sum(r), len(r)] for r in rounds],
            "mean_acceptance_length": 1.0 + sum(flat) / n_r, "mean_acceptance_length_ci95": bootstrap_interval(rounds),
            "accepted_per_position": [sum(r > k for r in flat) for k in range(depth)],
            "acceptance_rate_per_position": [sum(r > k for r in flat) / n_r for k in range(depth)]}


def bootstrap_interval(rounds: list[list[int]], n_boot: int = 1000, seed: int = 0) -> list[float] | None:
    """95% interval of the mean acceptance length, resampling whole samples (None below 2 samples).

    Rounds of one answer are correlated (an easy answer accepts a lot
    throughout), so the answer, not the round, is the unit resampled: with a
    handful of samples the interval is honestly wide.
    """
    per = [(sum(r), len(r)) for r in rounds if r]
    if len(per) < 2:
        return None
    acc = torch.tensor([a for a, _ in per], dtype=torch.float64)
    cnt = torch.tensor([n for _, n in per], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(per), (n_boot, len(per)), generator=g)
    means = 1.0 + acc[pick].sum(1) / cnt[pick].sum(1)
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [lo, hi]


def round_masks(batch: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft k of the round at t drafts an answer token [B, T, depth], a round starts at t [B, T]).

    Decoding stops once it has emitted the answer's last token (its end of
    turn, or the token budget), so a round exists only while the token it
    drafts first is still part of the answer, and a draft past the end is
    never accepted. (`acc` and `tau_chain` keep the per-position convention
    of SpecForge and EAGLE-3, which scores the position after the last token too.)
    """
    valid = (batch["loss_mask"] & batch["attention_mask"]).long()  # [B, T]
    drafted = torch.stack([shift_left(valid, 2 + k).bool() for k in range(depth)], -1)  # [B, T, depth]
    return drafted, drafted[..., 0] & shift_left(valid, 1).bool()


def decode_rounds(run, start: torch.Tensor) -> list[int]:
    """Accepted drafts per round as greedy chain decoding meets them along one sample.

    `run[t]` is the accept length of a round whose known tokens end at t + 1
    (its depth-0 draft is token t + 2); `start[t]` says token t + 1 is an
    answer token, so the first start of an answer is the round right after
    the prefill's token. A round that accepts r drafts moves decoding r + 1
    tokens on (the bonus token): positions inside an accepted run are never
    round starts. Averaging over every position instead would over-weight
    the easy stretches a good drafter skips over. `run` may be a function of t,
    evaluated only at the rounds walked (a DFlash block costs a forward each).
    """
    s, T, t, out = start.tolist(), len(start), 0, []
    while t < T:
        if s[t]:
            r = int(run(t) if callable(run) else run[t])
            out.append(r)
            t += r + 1
        else:
            t += 1
    return out


def paired_interval(a: list[list[int]], b: list[list[int]], n_boot: int = 4000, seed: int = 0) -> dict:
    """B's mean acceptance length minus A's on the same answers, with a 95% interval resampling answers jointly.

    Why: two drafters scored on the same held-out answers share each answer's
    difficulty, so their separate intervals (about +-0.035 each here) hide
    differences a paired resample resolves (about +-0.02). ``a`` and ``b``:
    per answer, [accepted drafts, rounds] (``chain_stats(..., per_sample=True)``), in the same order.
    """
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired answers expected on both sides (got {len(a)} and {len(b)})")
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)  # [S, 2] each

    def mal(t: torch.Tensor) -> torch.Tensor:  # [..., S, 2] -> [...]
        return 1.0 + t[..., 0].sum(-1) / t[..., 1].sum(-1).clamp(min=1)

    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(a), (n_boot, len(a)), generator=g)
    diffs = mal(y[pick]) - mal(x[pick])
    lo, hi = torch.quantile(diffs, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    better = sum(float(p[0]) / max(float(p[1]), 1) > float(q[0]) / max(float(q[1]), 1) for q, p in zip(a, b))
    return {"a": float(mal(x)), "b": float(mal(y)), "diff": float(mal(y) - mal(x)), "ci95": [lo, hi],
            "answers": len(a), "b_better_on": better}
