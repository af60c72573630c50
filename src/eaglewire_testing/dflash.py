"""Small random DFlash drafters shared by the drafter, training and decoding tests."""

from __future__ import annotations

import torch

from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter


def small_config(**kw) -> DFlashConfig:
    """Hidden 32, 4 heads over 2 KV heads of 8, 2 layers, 2 points, vocab 50 (mask 49), blocks of 4."""
    base = dict(hidden_size=32, intermediate_size=48, num_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=50, target_layer_ids=(1, 3), mask_token_id=49, block_size=4,
                rope_theta=10000.0)
    return DFlashConfig(**{**base, **kw})


def small_model(seed: int = 0, **kw) -> DFlashDrafter:
    """A float64 random drafter with non-trivial norm weights (a norm left at 1 would hide a missing norm)."""
    torch.manual_seed(seed)
    m = DFlashDrafter(small_config(**kw)).double()
    for p in m.parameters():
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    return m


def one_thread():
    """Generator body for a module fixture: tiny float64 matmuls on a loaded 2-core machine wait on OpenMP
    threads that lost their core (a 4x slowdown measured); one thread is faster at these sizes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
