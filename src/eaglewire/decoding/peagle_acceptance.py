"""The offline acceptance walk for a P-EAGLE drafter: parallel rounds replayed along stored answers.

Why: held-out acceptance must be comparable across drafter kinds and run
without the target; `acceptance.chain_stats` replays EAGLE-3 chains, but a
P-EAGLE drafter drafts its K tokens from one forward over mask slots, which a
chain unroll does not run. This replays that forward at every round decoding
meets (`round_masks`, `decode_rounds`, as for EAGLE-3 and DFlash): the round
whose known tokens end at t + 1 reads the real rows `(x[j+1], f[j])` of
positions j <= t (row t carries the bonus) and K-1 mask slots at t + 1 ..,
exactly `ParallelEngine`'s round (decoding/peagle.py); draft k is compared with
the target's own argmax at t + 1 + k (`target_hidden` through the head), what
a greedy verify accepts. The real rows are causal, so their K/V is computed
once per answer and each round only runs its last row and its slots. On
greedy answers this equals online parallel decoding round for round
(tests/decoding/test_peagle_acceptance.py checks it against `ParallelEngine`).
"""

from __future__ import annotations

import torch

from eaglewire.data.dataset import collate
from eaglewire.decoding.acceptance import decode_rounds, round_masks, rounds_summary
from eaglewire.decoding.block_acceptance import slot_indices
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.drafter.ttt import target_full_argmax
from eaglewire.infra.errors import EaglewireError


@torch.no_grad()
def _sample_rounds(drafter: PEagleDrafter, sample: dict, slots: list[int] | None, head_w: torch.Tensor,
                   depth: int) -> list[int]:
    """Accepted drafts per round along one stored answer, walking as decoding does."""
    b = collate([sample])
    feats = b["features"].float()  # [1, T, P, H]
    feats = (feats[:, :, slots] if slots is not None else feats).flatten(2)  # [1, T, A*H]
    ids = b["input_ids"]  # [1, T]
    T = ids.shape[1]
    if T < 2:
        return []
    tgt = target_full_argmax(b["target_hidden"].float(), head_w)[0]  # [T]: the target's next token after t
    served, start = round_masks(b, depth)  # [1, T, depth], [1, T]
    # every real row (x[j+1], f[j]), j = 0 .. T-2, once: row j's K/V depends on rows <= j only
    _, rows = drafter.parallel_draft(ids[:, 1:], feats[:, :-1], torch.arange(T - 1)[None], None, 1)

    def run(t: int) -> int:  # accepted drafts of the round whose known tokens end at t + 1
        logits, _ = drafter.parallel_draft(ids[:, t + 1:t + 2], feats[:, t:t + 1], torch.tensor([[t]]),
                                           [(k[:, :, :t], v[:, :, :t]) for k, v in rows] if t else None, depth)
        drafts = drafter.draft_to_target(logits[0].argmax(-1))  # [depth] draft k = token t + 2 + k
        want = tgt[t + 1:t + 1 + depth]  # the target's tokens at t + 2 .. t + 1 + depth
        hit = (drafts[:len(want)] == want) & served[0, t, :len(want)]
        return int(torch.cumprod(hit.long(), 0).sum())

    return decode_rounds(run, start[0])


def parallel_chain_stats(drafter: PEagleDrafter, ds, head_w: torch.Tensor, num_samples: int, depth: int,
                         points: list[str] | None = None) -> dict:
    """vLLM's figures for a P-EAGLE drafter (K = ``depth`` parallel drafts) on stored answers: 1 + accepted per
    round, per position, its 95% interval. ``points``: the drafter's capture points, picked among the dataset's
    stored ones (None: every stored point, in stored order, as `chain_stats` reads them)."""
    if depth < 1:
        raise EaglewireError(f"depth {depth}: a P-EAGLE round drafts at least 1 token")
    slots = None
    if points is not None:
        slots = slot_indices([p.name for p in ds.manifest.points or []], list(points), "the P-EAGLE drafter")
    drafter = drafter.float().eval()
    head_w = head_w.float()
    rounds = [_sample_rounds(drafter, ds[i], slots, head_w, depth) for i in range(min(num_samples, len(ds)))]
    return rounds_summary(rounds, depth)
