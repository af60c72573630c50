"""The invariant every `d2t` keeps, checked wherever one is built or read (training, export, import, doctor)."""

from __future__ import annotations

import torch


def duplicate_target(d2t: torch.Tensor) -> int | None:
    """A target id that two draft ids map to (d2t as offsets: target = draft + d2t[draft]), or None.

    A draft vocabulary names each target token once: a repeated one makes two
    draft logits compete for one token and leaves another token undraftable,
    and llama.cpp's converter refuses the file ("duplicate target ids").
    """
    tgt = d2t.long().flatten() + torch.arange(d2t.numel(), dtype=torch.int64, device=d2t.device)
    uniq, counts = torch.unique(tgt, return_counts=True)
    dup = uniq[counts > 1]
    return int(dup[0]) if dup.numel() else None
