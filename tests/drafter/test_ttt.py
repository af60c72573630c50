"""Training-time test: efficient implementation vs the naive reference, and learning."""

from __future__ import annotations

import time

import pytest
import torch

from eaglewire.drafter import (
    DrafterConfig,
    Eagle3Drafter,
    target_full_argmax,
    ttt_attention_mask,
    ttt_forward,
    ttt_forward_naive,
)

V, D, HT, A = 97, 50, 24, 3


def make_model(seed=0, dtype=torch.float64, **overrides) -> Eagle3Drafter:
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
    torch.manual_seed(seed)
    model = Eagle3Drafter(DrafterConfig(**cfg)).to(dtype)
    model.load_target_embedding(torch.randn(V, 32, dtype=dtype))
    g = torch.Generator().manual_seed(seed + 1)
    d = cfg["draft_vocab_size"]
    model.set_draft_vocab(torch.sort(torch.randperm(V, generator=g)[:d]).values)
    return model


def make_batch(b=2, t=10, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    feats = torch.randn(b, t, A * HT, generator=g, dtype=dtype)
    th = torch.randn(b, t, HT, generator=g, dtype=dtype)
    head = torch.randn(V, HT, generator=g, dtype=dtype)
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


def _grads(model, out):
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("steps", [1, 3, 7])
@pytest.mark.parametrize(
    "overrides", [{}, {"num_layers": 2, "fc_norm": True, "norm_before_residual": True}]
)
def test_efficient_matches_naive(steps, overrides):
    model = make_model(**overrides)
    batch = make_batch()
    fast = ttt_forward(model, steps=steps, **batch)
    g_fast = _grads(model, fast)
    slow = ttt_forward_naive(model, steps=steps, **batch)
    g_slow = _grads(model, slow)
    # the masked target set is non-trivial: some argmaxes fall outside the draft vocab
    argmax = batch["target_hidden"] @ batch["target_head_weight"].T
    in_draft = model.t2d[argmax.argmax(-1)]
    assert in_draft.any() and not in_draft.all()
    torch.testing.assert_close(fast.loss, slow.loss, rtol=1e-5, atol=1e-12)
    for a, b in zip(fast.step_losses, slow.step_losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)
    assert [int(c) for c in fast.counts] == [int(c) for c in slow.counts]
    assert [int(c) for c in fast.correct] == [int(c) for c in slow.correct]
    assert int(fast.counts[0]) > 0
    assert set(g_fast) == set(g_slow) and "embed_tokens.weight" not in g_fast
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_slow[name], rtol=1e-5, atol=1e-10, msg=name)


def test_fp32_matches_naive():
    model = make_model(dtype=torch.float32)
    batch = make_batch(dtype=torch.float32)
    fast = ttt_forward(model, steps=3, **batch)
    slow = ttt_forward_naive(model, steps=3, **batch)
    torch.testing.assert_close(fast.loss, slow.loss, rtol=1e-4, atol=1e-6)


def test_counts_follow_shift_convention():
    """Step k trains target positions s = t+1+k: counts shrink by one position per step."""
    model = make_model(draft_vocab_size=V)  # every argmax in vocab -> mask = loss x attention
    batch = make_batch(b=1, t=8)
    batch["loss_mask"] = torch.ones(1, 8, dtype=torch.long)
    batch["attention_mask"] = torch.ones(1, 8, dtype=torch.long)
    out = ttt_forward(model, steps=9, **batch)
    assert [int(c) for c in out.counts] == [7, 6, 5, 4, 3, 2, 1, 0, 0]
    assert torch.isfinite(out.loss)


def test_right_padding_invariance_and_precomputed_argmax():
    model = make_model()
    batch = make_batch(b=1, t=8)
    base = ttt_forward(model, steps=3, **batch)
    padded = {
        k: torch.nn.functional.pad(v, (0, 0, 0, 4) if v.dim() == 3 else (0, 4))
        for k, v in batch.items()
        if k != "target_head_weight"
    }
    padded["target_head_weight"] = batch["target_head_weight"]
    out = ttt_forward(model, steps=3, **padded)
    torch.testing.assert_close(out.loss, base.loss, rtol=1e-10, atol=1e-12)
    am = target_full_argmax(batch["target_hidden"], batch["target_head_weight"], chunk=7)
    ref = (batch["target_hidden"] @ batch["target_head_weight"].T).argmax(-1)
    assert torch.equal(am, ref)
    pre = ttt_forward(model, steps=3, target_argmax=am, **batch)
    torch.testing.assert_close(pre.loss, base.loss)


def test_block_mask_layout():
    m = ttt_attention_mask(3, 2)[0, 0]
    assert m.shape == (3, 9)
    assert torch.equal(m[:, :3], torch.ones(3, 3, dtype=torch.bool).tril())
    assert torch.equal(m[:, 3:6], torch.eye(3, dtype=torch.bool))
    assert torch.equal(m[:, 6:], torch.eye(3, dtype=torch.bool))


def test_tiny_drafter_overfits():
    torch.manual_seed(0)
    model = make_model(dtype=torch.float32, draft_vocab_size=V)
    batch = make_batch(b=4, t=32, seed=3, dtype=torch.float32)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    start, acc0 = time.time(), 0.0
    for _ in range(400):
        out = ttt_forward(model, steps=2, **batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        acc0 = out.acc[0]
        if acc0 >= 0.95:
            break
    assert acc0 >= 0.95, acc0
    assert time.time() - start < 30
