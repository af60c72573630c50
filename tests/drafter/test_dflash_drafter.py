"""DFlashDrafter against a per-position float64 re-implementation of the design note's equations."""

from __future__ import annotations

import math

import pytest
import torch

from eaglewire.drafter.dflash import DFlashDrafter, default_target_layer_ids
from eaglewire_testing.dflash import one_thread, small_config, small_model

pytestmark = pytest.mark.unit
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _rms(x, w, eps):
    return w * x / math.sqrt(float((x * x).mean()) + eps)


def _rot(x, pos, theta):
    """RoPE on one head vector (rotate-half layout): pair (i, i + d/2) at angle pos * theta^(-2i/d)."""
    d = x.shape[0]
    out = x.clone()
    for i in range(d // 2):
        a = pos * theta ** (-2 * i / d)
        c, s = math.cos(a), math.sin(a)
        out[i] = x[i] * c - x[i + d // 2] * s
        out[i + d // 2] = x[i + d // 2] * c + x[i] * s
    return out


def reference(m: DFlashDrafter, feats, ctx_pos, embeds, blk_pos):
    """One sequence: feats [C, A*H] at ctx_pos, block embeds [Q, H] at blk_pos; every block query sees every key."""
    c = m.config
    eps, th, hd = c.rms_norm_eps, c.rope_theta, c.head_dim
    fused = [_rms(m.fc.weight @ f, m.hidden_norm.weight, eps) for f in feats]  # hidden_norm(fc(cat))
    h = [e.clone() for e in embeds]
    for layer in m.layers:
        a = layer.self_attn
        xn = [_rms(x, layer.input_layernorm.weight, eps) for x in h]

        def key(src, pos, kv, a=a):
            k = (a.k_proj.weight @ src).view(c.num_key_value_heads, hd)[kv]
            return _rot(_rms(k, a.k_norm.weight, eps), pos, th)

        def val(src, kv, a=a):
            return (a.v_proj.weight @ src).view(c.num_key_value_heads, hd)[kv]

        srcs = [(f, p) for f, p in zip(fused, ctx_pos, strict=True)] + list(zip(xn, blk_pos, strict=True))
        new_h = []
        for x, qp, hin in zip(xn, blk_pos, h, strict=True):
            heads = []
            for head in range(c.num_attention_heads):
                kv = head // (c.num_attention_heads // c.num_key_value_heads)
                q = _rot(_rms((a.q_proj.weight @ x).view(c.num_attention_heads, hd)[head], a.q_norm.weight, eps), qp, th)
                scores = torch.stack([q @ key(s, p, kv) / math.sqrt(hd) for s, p in srcs])
                w = scores.softmax(0)
                heads.append(sum(wi * val(s, kv) for wi, (s, _) in zip(w, srcs, strict=True)))
            y = hin + a.o_proj.weight @ torch.cat(heads)
            z = _rms(y, layer.post_attention_layernorm.weight, eps)
            mlp = layer.mlp
            up = torch.nn.functional.silu(mlp.gate_proj.weight @ z) * (mlp.up_proj.weight @ z)
            new_h.append(y + mlp.down_proj.weight @ up)
        h = new_h
    return torch.stack([_rms(x, m.norm.weight, eps) for x in h])


def test_forward_equals_naive_reference():
    m = small_model()
    c = m.config
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 5, c.num_aux * c.hidden_size, generator=g, dtype=torch.float64)
    embeds = torch.randn(1, c.block_size, c.hidden_size, generator=g, dtype=torch.float64)
    ctx_pos = torch.arange(5)[None]
    blk_pos = torch.arange(5, 5 + c.block_size)[None]
    with torch.no_grad():
        got = m.block(embeds, blk_pos, m.context_kv(feats, ctx_pos))
        want = reference(m, feats[0], ctx_pos[0].tolist(), embeds[0], blk_pos[0].tolist())
    # transformers' rotary module forms cos/sin in float32 (inv_freq is a float32 buffer): ~1e-7, not 1e-15
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)


def test_context_positions_matter():
    """The context K/V carry their own positions: shifting them changes the draft (RoPE on the context half)."""
    m = small_model()
    c = m.config
    feats = torch.randn(1, 3, c.num_aux * c.hidden_size, dtype=torch.float64)
    embeds = torch.randn(1, c.block_size, c.hidden_size, dtype=torch.float64)
    pos = torch.arange(3, 3 + c.block_size)[None]
    a = m.block(embeds, pos, m.context_kv(feats, torch.arange(3)[None]))
    b = m.block(embeds, pos, m.context_kv(feats, torch.arange(1, 4)[None]))
    assert not torch.allclose(a, b)


def test_owns_no_embedding_nor_head():
    """The target's embedding and lm_head are borrowed (z-lab checkpoints carry neither)."""
    keys = set(small_model().state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight"} <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)


def test_default_ids_and_refusals():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B, SpecForge qwen3-8b-dflash.json
    assert default_target_layer_ids(30, 3) == [1, 14, 27]
    assert default_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    assert default_target_layer_ids(30, 1) == [15]
    with pytest.raises(ValueError, match="ascending"):
        small_config(target_layer_ids=(3, 1))
    with pytest.raises(ValueError, match="ascending"):
        small_config(target_layer_ids=(-1, 3))
    with pytest.raises(ValueError, match="mask_token_id"):
        small_config(mask_token_id=50)
    with pytest.raises(ValueError, match="block_size"):
        small_config(block_size=1)
    m = small_model()
    with pytest.raises(ValueError, match="concatenated"):
        m.fuse(torch.zeros(1, 2, 3 * 32, dtype=torch.float64))
