"""Warm start from the target: checked against transformers' own hidden states."""

from __future__ import annotations

import pytest
import torch

from eaglewire.drafter import DrafterConfig, Eagle3Drafter, causal_mask
from eaglewire.drafter.warmstart import init_from_target_layer, init_head
from eaglewire.targets.load import load_target


def _drafter(target, points, fc_norm=False, **kw):
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=64, num_aux=len(points), fc_norm=fc_norm, **kw)
    m = Eagle3Drafter(cfg)
    m.load_target_embedding(target.model.get_input_embeddings().weight.detach().float())
    m.set_draft_vocab(torch.arange(0, 128, 2))
    return m.eval()


def _hidden_states(target, ids):
    with torch.no_grad():
        return target.model(ids, output_hidden_states=True).hidden_states  # index k = output of layer k-1


def _case(t, seed: int, T: int):
    """Points (deepest n-3), token ids, transformers' hidden states and the captured features for them.

    The copied layer is n-2, whose output transformers reports as hidden_states[n-1]
    (hidden_states[n] is after the final norm).
    """
    n = t.num_layers
    points = ["layers.0.out", f"layers.{n - 3}.out"]
    torch.manual_seed(seed)
    ids = torch.randint(3, t.config.vocab_size, (1, T))
    hs = _hidden_states(t, ids)
    feats = torch.cat([hs[int(p.split(".")[1]) + 1] for p in points], -1)  # [1, T, 2H]
    return points, ids, hs, feats


def test_target_init_step0_is_the_next_target_layer(tiny_targets):
    t = tiny_targets["llama"]
    n = t.num_layers
    points, ids, hs, feats = _case(t, 0, 12)
    for fc_norm in (False, True):
        m = _drafter(t, points, fc_norm)
        scale = float(hs[n - 2][0, 1:].pow(2).mean(-1).sqrt().median())
        src = init_from_target_layer(m, t.model, points, scale)
        assert src == n - 2
        if fc_norm:  # the selection restores the scale: compare at the typical-norm positions only
            continue
        T = ids.shape[1]
        out, _ = m.step(ids, m.project(feats), torch.arange(T)[None], None, causal_mask(T))
        # the drafter's layer on the deepest slot == the target's next layer
        torch.testing.assert_close(out, hs[n - 1], rtol=1e-4, atol=1e-4)


def test_head_init_gives_the_target_logits_on_draft_rows(tiny_targets):
    t = tiny_targets["llama"]
    m = _drafter(t, ["layers.0.out"])
    init_head(m, t.model.get_output_embeddings().weight.detach().float(), t.model.base_model.norm.weight.detach().float())
    x = torch.randn(2, 5, t.hidden_size) * 3  # [B, T, H] a last-layer residual
    with torch.no_grad():
        ref = t.model.lm_head(t.model.base_model.norm(x))[..., m.draft_target_ids()]  # [B, T, D]
        got = m.logits(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_wider_mlp_starts_as_exactly_the_target_layer(tiny_targets):
    """--intermediate-size above the target's: the extra units are silent at init, the function is the target's."""
    import pytest

    t = tiny_targets["llama"]
    n = t.num_layers
    points, ids, hs, feats = _case(t, 1, 10)
    wide = 3 * t.config.intermediate_size
    m = _drafter(t, points, intermediate_size=wide)
    init_from_target_layer(m, t.model, points, 1.0)
    assert m.decoder_layers[0].mlp.gate_proj.weight[t.config.intermediate_size:].abs().sum() > 0  # not all zero
    T = ids.shape[1]
    out, _ = m.step(ids, m.project(feats), torch.arange(T)[None], None, causal_mask(T))
    torch.testing.assert_close(out, hs[n - 1], rtol=1e-4, atol=1e-4)
    narrow = _drafter(t, points, intermediate_size=t.config.intermediate_size // 2)
    with pytest.raises(ValueError, match="narrower than the target layer"):
        init_from_target_layer(narrow, t.model, points, 1.0)


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe"])
def test_init_target_refuses_a_layer_without_a_llama_counterpart(arch):
    """An MLA attention or a mixture-of-experts MLP has no q/k/v or gate/up/down to copy: one line naming
    the layer and the fix, not an AttributeError from deep inside the copy."""

    t = load_target(f"tiny:{arch}")
    n = len(t.model.model.layers)
    pts = ["layers.0.out", f"layers.{n - 3}.out"]
    d = Eagle3Drafter(DrafterConfig.from_target_config(t.config, draft_vocab_size=32, num_aux=2))
    with pytest.raises(ValueError, match=rf"target layer {n - 2} has a .* without .*use --init head"):
        init_from_target_layer(d, t.model, pts, 1.0)
