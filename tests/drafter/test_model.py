"""Eagle3Drafter: layout, explicit-KV step semantics, config round trips."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from eaglewire.drafter import DrafterConfig, Eagle3Drafter, causal_mask
from eaglewire_testing.drafters import drafter_config


def tiny_config(**overrides) -> DrafterConfig:
    return drafter_config(**overrides)


def tiny_model(seed: int = 0, **overrides) -> Eagle3Drafter:
    torch.manual_seed(seed)
    model = Eagle3Drafter(tiny_config(**overrides)).double()
    model.load_target_embedding(torch.randn(97, 32, dtype=torch.float64))
    for p in model.parameters():  # non-trivial norm weights
        if p.dim() == 1 and p.requires_grad:
            p.data.uniform_(0.5, 1.5)
    return model


EXPECTED_KEYS = {
    "embed_tokens.weight",
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
}


def test_state_dict_keys_exact():
    model = Eagle3Drafter(tiny_config())
    sd = model.state_dict()
    assert set(sd) == EXPECTED_KEYS
    assert sd["d2t"].dtype == torch.int64 and sd["d2t"].shape == (50,)
    assert sd["t2d"].dtype == torch.bool and sd["t2d"].shape == (97,)
    assert sd["fc.weight"].shape == (32, 72)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (32, 64)  # 2H input
    assert sd["midlayer.self_attn.k_proj.weight"].shape == (16, 64)
    assert sd["lm_head.weight"].shape == (50, 32)


def test_multi_layer_and_fc_norm_naming():
    sd = Eagle3Drafter(tiny_config(num_layers=2, fc_norm=True)).state_dict()
    assert not any(k.startswith("midlayer.") for k in sd)
    assert sd["layers.0.self_attn.q_proj.weight"].shape == (32, 64)
    assert sd["layers.1.self_attn.q_proj.weight"].shape == (32, 32)
    assert "layers.0.hidden_norm.weight" in sd and "layers.1.hidden_norm.weight" not in sd
    assert sd["fc_norm.weight"].shape == (72,)


def test_embedding_frozen_and_vocab_map():
    model = Eagle3Drafter(tiny_config())
    w = torch.randn(97, 32)
    model.load_target_embedding(w)
    assert torch.equal(model.embed_tokens.weight, w)
    assert not model.embed_tokens.weight.requires_grad
    assert "embed_tokens.weight" not in {n for n, p in model.named_parameters() if p.requires_grad}
    with pytest.raises(ValueError):
        model.load_target_embedding(torch.randn(96, 32))
    # default mapping is the identity on the first D ids
    assert torch.equal(model.draft_to_target(torch.arange(50)), torch.arange(50))
    ids = torch.sort(torch.randperm(97)[:50]).values
    model.set_draft_vocab(ids)
    assert torch.equal(model.draft_to_target(torch.arange(50)), ids)
    assert torch.equal(model.t2d.nonzero().flatten(), ids)
    with pytest.raises(ValueError):
        model.set_draft_vocab(ids.flip(0))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_layers": 2}, {"norm_before_residual": True, "fc_norm": True},
     {"norm_before_fc": True, "norm_output": True, "num_layers": 2}],
)
def test_incremental_equals_batch(overrides):
    model = tiny_model(**overrides)
    b, t = 2, 9
    ids = torch.randint(0, 97, (b, t))
    hidden = model.project(torch.randn(b, t, 72, dtype=torch.float64))  # [B, T, H]
    pos = torch.arange(t)[None].expand(b, t)
    full, _ = model.step(ids, hidden, pos, None, causal_mask(t))
    cache, outs = None, []
    for i in range(t):
        out, kv = model.step(
            ids[:, i : i + 1],
            hidden[:, i : i + 1],
            pos[:, i : i + 1],
            cache,
            causal_mask(1, past=i),
        )
        cache = (
            kv
            if cache is None
            else [
                (torch.cat([a, c], 2), torch.cat([b_, d], 2))
                for (a, b_), (c, d) in zip(cache, kv, strict=True)
            ]
        )
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)
    assert full.dtype == torch.float64


def test_tree_mask_equals_separate_branches():
    """Prefix of 5, then a tree: root r, children a, b; a has child c (two branches r-a-c, r-b)."""
    model = tiny_model(num_layers=2)
    p = 5
    ids = torch.randint(0, 97, (1, p))
    hid = torch.randn(1, p, 32, dtype=torch.float64)
    _, prefix_kv = model.step(ids, hid, torch.arange(p)[None], None, causal_mask(p))
    # tree nodes: 0=r, 1=a, 2=b, 3=c ; parent: a->r, b->r, c->a
    tok = torch.randint(0, 97, (1, 4))
    th = torch.randn(1, 4, 32, dtype=torch.float64)
    depth = torch.tensor([[0, 1, 1, 2]]) + p
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(4, p, dtype=torch.bool), anc], 1)[None, None]  # [1,1,4,p+4]
    tree_out, _ = model.step(tok, th, depth, prefix_kv, mask)
    for branch in ([0, 1, 3], [0, 2]):
        n = len(branch)
        out, _ = model.step(
            tok[:, branch], th[:, branch], depth[:, branch], prefix_kv, causal_mask(n, past=p)
        )
        torch.testing.assert_close(out, tree_out[:, branch], rtol=1e-10, atol=1e-10)


def test_logits_shape_and_tied():
    model = tiny_model()
    out = model.logits(torch.randn(2, 3, 32, dtype=torch.float64))
    assert out.shape == (2, 3, 50)
    tied = Eagle3Drafter(tiny_config(draft_vocab_size=97, tie_word_embeddings=True))
    assert tied.lm_head.weight is tied.embed_tokens.weight


def test_config_round_trip_and_unknown_keys():
    cfg = tiny_config(num_layers=2, fc_norm=True)
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    bad = cfg.to_dict() | {"bogus": 1, "also_bad": 2}
    with pytest.raises(ValueError, match="also_bad.*bogus"):
        DrafterConfig.from_dict(bad)
    with pytest.raises(ValueError):
        tiny_config(draft_vocab_size=98)


def test_from_target_config():
    llama = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=300,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    cfg = DrafterConfig.from_target_config(llama, draft_vocab_size=100, num_layers=2)
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads) == (64, 8, 2)
    assert cfg.rope_theta == 500000.0 and cfg.rms_norm_eps == 1e-5
    assert (cfg.vocab_size, cfg.draft_vocab_size, cfg.target_hidden_size) == (300, 100, 64)
    assert cfg.num_layers == 2 and cfg.rope_scaling is None
    qwen = Qwen3Config(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=200,
    )
    cfg = DrafterConfig.from_target_config(qwen, draft_vocab_size=50)
    assert cfg.head_dim == 16
    Eagle3Drafter(cfg)  # heads*head_dim != hidden must still build
    with pytest.raises(ValueError, match="nope"):
        DrafterConfig.from_target_config(llama, draft_vocab_size=100, nope=1)


def test_norm_before_fc_and_norm_output_against_a_naive_reading():
    """norm_before_fc: one RMS over all slots together; norm_output: the final-normed hidden is what the next
    step reads and what lm_head reads (normed once). Same weights with the flags off give the reference."""
    plain = tiny_model()
    model = tiny_model(norm_before_fc=True, norm_output=True)
    model.load_state_dict({**plain.state_dict(), "input_norm.weight": torch.rand(72, dtype=torch.float64) + 0.5})
    x = torch.randn(2, 5, 72, dtype=torch.float64)
    w, eps = model.input_norm.weight, model.config.rms_norm_eps
    naive = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w) @ plain.fc.weight.T  # [B, T, H]
    torch.testing.assert_close(model.project(x), naive)
    ids, pos = torch.randint(0, 97, (2, 5)), torch.arange(5)[None]
    h = model.project(x)
    out_plain, _ = plain.step(ids, h, pos, None, causal_mask(5))
    out, _ = model.step(ids, h, pos, None, causal_mask(5))
    torch.testing.assert_close(out, plain.norm(out_plain))  # fed back normed
    torch.testing.assert_close(model.logits(out), plain.logits(out_plain))  # and not normed twice
    with pytest.raises(ValueError, match="choose one"):
        tiny_config(fc_norm=True, norm_before_fc=True)
