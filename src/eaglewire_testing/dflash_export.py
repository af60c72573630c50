"""Small DFlash checkpoints for the export and import tests (random weights, no target needed)."""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire_testing.export_helpers import provenance

L = 30  # the default target's depth: z-lab ids [1, 14, 28] are its eagle3-deep points
POINTS = ("layers.1.out", "layers.14.out", "layers.28.out")


def dflash_config(layers: tuple[int, ...] = (1, 14, 28), **kw) -> DFlashConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=50, target_layer_ids=tuple(layers), mask_token_id=16, block_size=4,
                rope_theta=10000.0)
    return DFlashConfig(**{**base, **kw})


def make_dflash_ckpt(path: Path, points: tuple[str, ...] = POINTS, num_layers: int = L, seed: int = 0,
                     model_type: str | None = "llama", **kw) -> tuple[Path, DFlashDrafter]:
    """A saved DFlash drafter on `points` (z-lab id k = layers.k.out) with non-trivial norms."""
    cfg = dflash_config(tuple(int(p.split(".")[1]) for p in points), **kw)
    torch.manual_seed(seed)
    m = DFlashDrafter(cfg)
    with torch.no_grad():  # norms start at 1: perturb them so a dropped or swapped tensor would show
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return save_dflash_checkpoint(path, m, provenance(list(points), num_layers, model_type)), m
