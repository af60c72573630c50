"""Random drafters and TTT batches shared by the drafter tests and ``benchmarks/bench_ttt.py``."""

from __future__ import annotations

import torch

from eaglewire.drafter import DrafterConfig, Eagle3Drafter

V, D, HT, A = 97, 50, 24, 3  # target vocab, draft vocab, target hidden, captured points


def drafter_config(**overrides) -> DrafterConfig:
    """A tiny drafter config (hidden 32, 3 points of width HT, vocab V, draft vocab D)."""
    return DrafterConfig(**_config_dict(**overrides))


def _config_dict(**overrides) -> dict:
    cfg = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=128,
        target_hidden_size=HT,
        num_aux=A,
        vocab_size=V,
        draft_vocab_size=D,
    )
    cfg.update(overrides)
    return cfg


def make_model(seed=0, dtype=torch.float64, **overrides) -> Eagle3Drafter:
    """A random drafter (default: :func:`drafter_config`) with a random draft vocab."""
    cfg = _config_dict(**overrides)
    torch.manual_seed(seed)
    model = Eagle3Drafter(DrafterConfig(**cfg)).to(dtype)
    v = cfg["vocab_size"]
    model.load_target_embedding(torch.randn(v, cfg["hidden_size"], dtype=dtype))
    g = torch.Generator().manual_seed(seed + 1)
    model.set_draft_vocab(torch.sort(torch.randperm(v, generator=g)[: cfg["draft_vocab_size"]]).values)
    return model


def make_batch(b=2, t=10, seed=0, dtype=torch.float64, vocab=V, target_hidden=HT, aux=A) -> dict:
    """Random TTT inputs with a prompt, a hole in the loss mask and right padding on row 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, t), generator=g)
    feats = torch.randn(b, t, aux * target_hidden, generator=g, dtype=dtype)
    th = torch.randn(b, t, target_hidden, generator=g, dtype=dtype)
    head = torch.randn(vocab, target_hidden, generator=g, dtype=dtype)
    loss_mask = torch.ones(b, t, dtype=torch.long)
    loss_mask[:, :2] = 0  # "prompt"
    loss_mask[0, 5] = 0  # a hole
    attn = torch.ones(b, t, dtype=torch.long)
    if b > 1:
        attn[1, t - 3 :] = 0  # right padding
        loss_mask[1, t - 3 :] = 0
    return dict(
        features=feats,
        input_ids=ids,
        target_hidden=th,
        target_head_weight=head,
        loss_mask=loss_mask,
        attention_mask=attn,
    )
