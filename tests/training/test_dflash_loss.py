"""DFlash training: the multi-block forward equals each block run alone at inference; anchors; the weighted loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from eaglewire.infra.errors import EaglewireError
from eaglewire.training.dflash_loss import (
    block_mask,
    build_blocks,
    default_gamma,
    dflash_forward,
    sample_anchors,
    slot_weights,
)
from eaglewire_testing.dflash import one_thread, small_model

pytestmark = pytest.mark.unit
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

T, V, BK = 14, 50, 4


def batch(seed: int = 0):
    """Two sequences, the second right-padded after 11 tokens; loss on the answer part."""
    g = torch.Generator().manual_seed(seed)
    m = small_model()
    c = m.config
    ids = torch.randint(0, V - 1, (2, T), generator=g)
    attn = torch.ones(2, T, dtype=torch.long)
    attn[1, 11:] = 0
    lm = torch.zeros(2, T, dtype=torch.long)
    lm[0, 4:] = 1
    lm[1, 3:11] = 1
    feats = torch.randn(2, T, c.num_aux * c.hidden_size, generator=g, dtype=torch.float64)
    embed = torch.randn(V, c.hidden_size, generator=g, dtype=torch.float64)
    head = torch.randn(V, c.hidden_size, generator=g, dtype=torch.float64)
    return m, ids, attn, lm, feats, embed, head


def per_block(m, feats, ids, embed, anchors, keep):
    """Each kept block alone through the inference forward: context = positions < a, no mask."""
    out = {}
    for b in range(ids.shape[0]):
        ctx = m.context_kv(feats[b : b + 1, :], torch.arange(ids.shape[1])[None])
        for n, (a, k) in enumerate(zip(anchors[b].tolist(), keep[b].tolist(), strict=True)):
            if not k:
                continue
            toks = torch.tensor([[int(ids[b, a])] + [m.config.mask_token_id] * (BK - 1)])
            sliced = [(kk[:, :, :a], vv[:, :, :a]) for kk, vv in ctx]
            out[b, n] = m.block(F.embedding(toks, embed), torch.arange(a, a + BK)[None], sliced)[0]
    return out


def vectorised(m, feats, ids, lm, attn, embed, anchors, keep, mask=None):
    blocks = build_blocks(ids, lm, anchors, keep, BK, m.config.mask_token_id, None, attn)
    ctx = m.context_kv(feats, torch.arange(ids.shape[1])[None])
    h = m.block(F.embedding(blocks.tokens, embed), blocks.positions, ctx, blocks.mask if mask is None else mask)
    return h, blocks


def planted(mask: torch.Tensor, t: int, kind: str) -> torch.Tensor:
    """The good mask with one bug: a block also sees the next block, or is causal inside itself."""
    bad = mask.clone()
    q = bad.shape[2]
    blk = torch.arange(q) // BK
    own = bad[:, :, :, t:]
    if kind == "next":
        own |= (blk[None, :] == blk[:, None] + 1)[None, None]
    else:
        own &= (torch.arange(q)[None, :] <= torch.arange(q)[:, None])[None, None]
    return bad


def test_multi_block_forward_equals_each_block_alone():
    m, ids, attn, lm, feats, embed, _ = batch()
    anchors, keep = sample_anchors(lm, 5, BK, torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = per_block(m, feats, ids, embed, anchors, keep)
        got, blocks = vectorised(m, feats, ids, lm, attn, embed, anchors, keep)
        assert len(want) >= 8
        for (b, n), ref in want.items():
            torch.testing.assert_close(got[b, n * BK : (n + 1) * BK], ref, rtol=1e-10, atol=1e-10)
        for kind in ("next", "causal"):  # the comparison catches a wrong mask
            bad, _ = vectorised(m, feats, ids, lm, attn, embed, anchors, keep, planted(blocks.mask, T, kind))
            worst = max(float((bad[b, n * BK : (n + 1) * BK] - ref).abs().max()) for (b, n), ref in want.items())
            assert worst > 1e-3, kind


def test_anchors_follow_the_loss_mask():
    lm = torch.zeros(3, 10, dtype=torch.long)
    lm[0, 2:9] = 1  # candidates 2..6: in the mask and a <= T - BK = 6
    lm[1, 7:] = 1  # answer too close to the end for a whole block: no candidate
    lm[2, :] = 1
    for seed in range(5):
        a, keep = sample_anchors(lm, 4, BK, torch.Generator().manual_seed(seed))
        assert a.shape == (3, 4)
        row = a[0][keep[0]].tolist()
        assert len(row) == 4 and row == sorted(set(row)) and all(2 <= x <= 6 for x in row)
        assert not keep[1].any() and (a[1] == 0).all()
        assert keep[2].all() and all(0 <= x <= 6 for x in a[2].tolist())
    seen = set()
    for seed in range(40):  # uniform without replacement: every candidate gets drawn
        a, keep = sample_anchors(lm, 2, BK, torch.Generator().manual_seed(seed))
        seen |= set(a[0][keep[0]].tolist())
    assert seen == set(range(2, 7))


def test_no_anchor_is_refused():
    m, ids, attn, _, feats, embed, head = batch()
    lm = torch.zeros_like(ids)
    lm[:, -2:] = 1  # only the last two positions: no room for a block of 4
    with pytest.raises(EaglewireError, match="no loss-masked position with room for a block of 4"):
        dflash_forward(m, feats, ids, embed, head, lm, attention_mask=attn)


def test_block_mask_by_hand():
    got = block_mask(torch.tensor([[2, 4]]), 5, 2)[0, 0].int().tolist()
    assert got == [
        [1, 1, 0, 0, 0, 1, 1, 0, 0],  # block 0 (anchor 2): context 0..1, its own two slots
        [1, 1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 1, 1],  # block 1 (anchor 4): context 0..3, never block 0
        [1, 1, 1, 1, 0, 0, 0, 1, 1],
    ]


def test_slot_weights():
    assert default_gamma(16) == 7.0 and default_gamma(8) == 4.0
    w = slot_weights(16, 7.0).tolist()
    assert w[0] == 0.0 and w[1] == 1.0
    assert w[15] == pytest.approx(math.exp(-14 / 7))
    assert slot_weights(4, None).tolist() == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("soft", [False, True])
def test_loss_equals_a_per_block_loop(soft):
    """Labels x[a+k] (soft: the target's distribution at a+k-1), weights decay * loss_mask * inside, by hand."""
    m, ids, attn, lm, feats, embed, head = batch(1)
    th = torch.randn(2, T, m.config.hidden_size, dtype=torch.float64) if soft else None
    out = dflash_forward(m, feats, ids, embed, head, lm, num_anchors=5, gamma=2.0, attention_mask=attn,
                         target_hidden=th, generator=torch.Generator().manual_seed(7))
    anchors, keep = sample_anchors(lm, 5, BK, torch.Generator().manual_seed(7))
    num = den = 0.0
    with torch.no_grad():
        for (b, n), h in per_block(m, feats, ids, embed, anchors, keep).items():
            a = int(anchors[b, n])
            for k in range(1, BK):
                if a + k >= T or not lm[b, a + k]:
                    continue
                w = math.exp(-(k - 1) / 2.0)
                logp = (head @ h[k]).log_softmax(-1)
                if soft:
                    ce = -float(((head @ th[b, a + k - 1]).softmax(-1) * logp).sum())
                else:
                    ce = -float(logp[ids[b, a + k]])
                num, den = num + w * ce, den + w
    assert float(out.loss.detach()) == pytest.approx(num / den, rel=1e-6)  # the slot weights are float32
    assert out.count.sum() > 0 and len(out.acc) == BK - 1
