"""Block-mask TTT, the previous implementation, kept as a test and benchmark reference.

It computes the same thing as :func:`eaglewire.drafter.ttt.ttt_forward` through
one generic ``model.step`` per step over all (k+1)T keys with the block mask
[causal | eye * k]; the tests check the two agree and ``bench_ttt.py`` times them.
"""

from __future__ import annotations

import torch

from eaglewire.drafter.model import KV, Eagle3Drafter
from eaglewire.drafter.ttt import (
    TTTOutput,
    _defaults,
    _step_loss,
    prepare_targets,
    shift_left,
    ttt_attention_mask,
)


def ttt_forward_blockmask(
    model: Eagle3Drafter,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    target_hidden: torch.Tensor,
    target_head_weight: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    target_argmax: torch.Tensor | None = None,
    steps: int = 7,
    decay: float = 0.8,
) -> TTTOutput:
    """Block-mask TTT (the previous implementation), kept as a fast reference.

    Step k's keys are appended to a cache holding steps 0..k-1 and one generic
    ``model.step`` uses the block mask [causal | eye * k] over all (k+1)T keys.
    """
    loss_mask, attention_mask = _defaults(input_ids, loss_mask, attention_mask)
    tg = prepare_targets(
        model, target_hidden, target_head_weight, loss_mask, attention_mask, target_argmax
    )
    b, t = input_ids.shape
    hidden = model.project(features)  # [B, T, H]
    cache: list[KV] | None = None
    out = TTTOutput(loss=hidden.new_zeros(()))
    for k in range(steps):
        tokens = shift_left(input_ids, 1 + k)  # [B, T]: x[t+1+k]
        pos = torch.arange(t, device=input_ids.device)[None] + k  # [1, T]
        mask = ttt_attention_mask(t, k, device=input_ids.device)  # [1, 1, T, (k+1)T]
        hidden, new_kv = model.step(tokens, hidden, pos, cache, mask)  # [B, T, H]
        if cache is None:
            cache = new_kv
        else:
            cache = [
                (torch.cat([ck, nk], dim=2), torch.cat([cv, nv], dim=2))
                for (ck, cv), (nk, nv) in zip(cache, new_kv, strict=True)
            ]
        loss_k, correct, count = _step_loss(model, hidden, tg, 1 + k, gather=False)
        out.record(decay**k, loss_k, correct, count)
    return out
