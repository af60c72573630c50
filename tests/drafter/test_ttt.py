"""Training-time test: efficient implementation vs the naive reference, and learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglewire.drafter import attention as attention_mod
from eaglewire.drafter import model as model_mod
from eaglewire.drafter import (
    target_full_argmax,
    ttt_attention_mask,
    ttt_forward,
    ttt_forward_naive,
)
from eaglewire.drafter import ttt as ttt_mod
from eaglewire_testing.drafters import V, make_batch, make_model
from eaglewire_testing.ttt_blockmask import ttt_forward_blockmask


def _grads(model, out):
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("steps", [1, 3, 7])
@pytest.mark.parametrize(
    "overrides", [{}, {"num_layers": 2, "fc_norm": True, "norm_before_residual": True},
                  {"norm_before_fc": True, "norm_output": True}]
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
    acc0 = 0.0
    for _ in range(400):
        out = ttt_forward(model, steps=2, **batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        acc0 = out.acc[0]
        if acc0 >= 0.95:
            break
    assert acc0 >= 0.95, acc0


# ------------------------------------------------- split TTT attention (fast path)
def _assert_same(fast, g_fast, ref, g_ref, rtol=1e-5):
    torch.testing.assert_close(fast.loss, ref.loss, rtol=rtol, atol=1e-12)
    for a, b in zip(fast.step_losses, ref.step_losses, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-12)
    assert [int(c) for c in fast.counts] == [int(c) for c in ref.counts]
    assert [int(c) for c in fast.correct] == [int(c) for c in ref.correct]
    assert set(g_fast) == set(g_ref)
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_ref[name], rtol=rtol, atol=1e-10, msg=name)


@pytest.mark.parametrize(
    "overrides", [{}, {"num_layers": 2, "fc_norm": True, "norm_before_residual": True},
                  {"norm_before_fc": True, "norm_output": True}]
)
def test_blockmask_reference_matches_naive(overrides):
    """The block-mask implementation (generic ``step``) stays a valid reference."""
    model = make_model(**overrides)
    batch = make_batch()
    ref = ttt_forward_blockmask(model, steps=3, **batch)
    g_ref = _grads(model, ref)
    slow = ttt_forward_naive(model, steps=3, **batch)
    _assert_same(ref, g_ref, slow, _grads(model, slow))


@pytest.mark.parametrize("attention", ["default", "matmul"])
@pytest.mark.parametrize("gather", [None, False])
def test_split_attention_matches_blockmask_long(monkeypatch, attention, gather):
    """Longer sequence, more heads per group, every step: split == block mask, loss and grads.

    ``matmul`` forces the device-agnostic fallback of the causal attention with
    log-sum-exp; ``gather=False`` the dense (accelerator) loss path.
    """
    if attention == "matmul":
        monkeypatch.setattr(model_mod, "causal_attention_lse", attention_mod.causal_attention_lse_matmul)
    if gather is not None:
        orig = ttt_mod._step_loss
        monkeypatch.setattr(
            ttt_mod, "_step_loss", lambda *a, **k: orig(*a, **{**k, "gather": gather})
        )
    model = make_model(num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    batch = make_batch(b=3, t=48, seed=5)
    fast = ttt_forward(model, steps=7, **batch)
    g_fast = _grads(model, fast)
    ref = ttt_forward_blockmask(model, steps=7, **batch)
    _assert_same(fast, g_fast, ref, _grads(model, ref), rtol=1e-9)


def test_step_ttt_matches_step_with_block_mask():
    """``step_ttt`` with per-step lists == generic ``step`` with the concatenated cache + mask."""
    model = make_model(num_layers=2)
    g = torch.Generator().manual_seed(7)
    b, t = 2, 9
    hidden = torch.randn(b, t, 32, generator=g, dtype=torch.float64)
    ttt_cache = [[] for _ in model.decoder_layers]
    cache = None
    h_fast = h_ref = hidden
    for k in range(4):
        ids = torch.randint(0, V, (b, t), generator=g)
        pos = torch.arange(t)[None] + k
        h_fast, kv_fast = model.step_ttt(ids, h_fast, pos, ttt_cache)
        h_ref, kv_ref = model.step(ids, h_ref, pos, cache, ttt_attention_mask(t, k))
        torch.testing.assert_close(h_fast, h_ref, rtol=1e-10, atol=1e-12)
        for lc, kv in zip(ttt_cache, kv_fast, strict=True):
            lc.append(kv)
        cache = (
            kv_ref
            if cache is None
            else [
                (torch.cat([ck, nk], 2), torch.cat([cv, nv], 2))
                for (ck, cv), (nk, nv) in zip(cache, kv_ref, strict=True)
            ]
        )


def test_hard_targets_are_plain_cross_entropy_on_the_target_argmax():
    """target_temperature=0: step 0's loss is F.cross_entropy against the target's full-vocab argmax."""
    model = make_model(draft_vocab_size=V)  # full vocab: every argmax is a draft id
    batch = make_batch(b=1, t=8)
    out = ttt_forward(model, steps=1, target_temperature=0.0, **batch)
    # independent reference: hidden states by hand, hard labels from full logits
    ids, th, head = batch["input_ids"], batch["target_hidden"], batch["target_head_weight"]
    tokens = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
    hidden, _ = model.step(tokens, model.project(batch["features"]), torch.arange(8)[None], None,
                           ttt_mod.ttt_attention_mask(8, 0))
    labels = (th @ head.T).argmax(-1)[:, 1:]  # [1, 7] target at s = t+1
    keep = (batch["loss_mask"][:, 1:] * batch["attention_mask"][:, 1:]).bool()
    ref = F.cross_entropy(model.logits(hidden)[:, :7][keep], labels[keep])
    torch.testing.assert_close(out.step_losses[0], ref)
    sharp = ttt_forward(model, steps=1, target_temperature=0.5, **batch)
    assert not torch.allclose(sharp.loss, out.loss) and not torch.allclose(sharp.loss, ttt_forward(model, steps=1, **batch).loss)


@pytest.mark.parametrize("gather", [True, False])
def test_lk_loss_adds_negative_log_acceptance(monkeypatch, gather):
    """lk_weight w: each step's loss is KL-CE + w * -log(sum_x min(p, q)), checked against a per-position
    loop over the plain KL run's own quantities; on either path (gathered rows or masked full rows)."""
    real = ttt_mod._step_loss
    monkeypatch.setattr(ttt_mod, "_step_loss", lambda *a, **k: real(*a, **{**k, "gather": gather}))
    model = make_model(draft_vocab_size=V)
    batch = make_batch(b=2, t=8)
    kl = ttt_forward(model, steps=2, **batch)
    w = 0.7
    both = ttt_forward(model, steps=2, lk_weight=w, **batch)
    tg = ttt_mod.prepare_targets(model, batch["target_hidden"], batch["target_head_weight"], batch["loss_mask"],
                                 batch["attention_mask"])
    hidden = model.project(batch["features"])
    tokens = torch.cat([batch["input_ids"][:, 1:], torch.zeros_like(batch["input_ids"][:, :1])], 1)
    hidden, _ = model.step(tokens, hidden, torch.arange(8)[None], None, ttt_mod.ttt_attention_mask(8, 0))
    p = model.logits(hidden).detach().double().softmax(-1).tolist()  # [B][T][D] step 0
    q = tg.probs.double().tolist()
    alphas = [sum(min(p[b][t][x], q[b][t + 1][x]) for x in range(len(p[b][t])))  # acceptance at t, target t+1
              for b in range(2) for t in range(7) if tg.valid[b, t + 1]]
    lk0 = torch.tensor(alphas).log().neg().mean()
    torch.testing.assert_close(both.step_losses[0], kl.step_losses[0] + w * lk0.to(kl.step_losses[0].dtype),
                               rtol=1e-4, atol=1e-6)
    assert both.loss > kl.loss
    same = ttt_mod.lk_loss(tg.probs.log(), tg.probs)  # p == q: alpha = 1, nothing to gain
    torch.testing.assert_close(same, torch.zeros_like(same), atol=1e-6, rtol=0)
