"""The lean decode/verify forward against transformers' own forward of the same model.

References: (a) transformers' forward of the whole sequence without any cache
(independent of our cache, masks and kernels), (b) the runner's transformers
path (``lean_why`` set) step by step. Every architecture the lean forward
takes is run past its sliding window, through causal and tree verifies and a
non-contiguous rollback.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.lean import LeanStack, layer_windows, why_not_lean
from eaglewire.targets.points import EMBED, FINAL_NORM, Point, eagle3_default
from eaglewire.targets.smallm import smallm_kernel

LEAN_ARCHS = ["llama", "qwen3", "mistral"]
TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)


def _points(target) -> list[Point]:
    return [EMBED, *eagle3_default(target.num_layers), FINAL_NORM]


def _steps(runner, ids):
    """Prefill 24 (on the lean runner 16 + 8 rows), 6 single tokens, a causal 4, a tree 4 and its rollback, one
    more token."""
    outs = [runner.forward(ids[:, :24])]
    outs += [runner.forward(ids[:, i:i + 1]) for i in range(24, 30)]
    outs.append(runner.forward(ids[:, 30:34]))
    outs.append(runner.forward(ids[:, 34:38], position_ids=torch.tensor([[34, 35, 35, 36]]), tree_mask=TREE))
    runner.keep(4, [0, 2, 3])  # path 0 -> 2 -> 3 skips the rejected sibling 1
    outs.append(runner.forward(ids[:, 38:39]))
    return outs


def _lean_runner(target, points, fused: bool) -> TargetRunner:
    """A runner on the lean forward: one C++ call per layer (kernels/lean_layer.cpp), or the tensor ops."""
    runner = TargetRunner(target, points)
    assert runner.lean_why is None
    runner._lean = LeanStack(runner.base, target.model.config)
    if fused and smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")
    if fused:
        assert runner._lean.fused is not None
    else:
        runner._lean.fused = None
    return runner


def _steps_match_transformers(target, ids, fused: bool) -> None:
    """Every step of :func:`_steps` on the lean runner equals the runner's transformers path."""
    lean = _lean_runner(target, [EMBED, FINAL_NORM], fused)
    ref = TargetRunner(target, [EMBED, FINAL_NORM])
    ref.lean_why = "off for the reference"
    for (h1, f1), (h2, f2) in zip(_steps(lean, ids), _steps(ref, ids)):
        torch.testing.assert_close(h1, h2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f1, f2, rtol=1e-5, atol=1e-5)


PATHS = pytest.mark.parametrize("fused", [True, False], ids=["fused", "ops"])


@PATHS
@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_lean_equals_transformers_step_by_step(tiny_targets, arch, fused):
    target = tiny_targets[arch]
    ids = torch.randint(0, target.model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    lean = _lean_runner(target, _points(target), fused)
    ref = TargetRunner(target, _points(target))
    ref.lean_why = "off for the reference"
    for (h1, f1), (h2, f2) in zip(_steps(lean, ids), _steps(ref, ids)):
        torch.testing.assert_close(h1, h2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f1, f2, rtol=1e-5, atol=1e-5)
    assert lean._lean is not None  # the lean path ran
    assert lean.length == ref.length == 38


@PATHS
@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_lean_decode_equals_one_uncached_forward(tiny_targets, arch, fused):
    """Token by token past the sliding window (16 in the tiny configs), then a 4-token causal verify."""
    target = tiny_targets[arch]
    n = 44
    ids = torch.randint(0, target.model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = decoder_stack(target.model)(input_ids=ids, use_cache=False).last_hidden_state  # [1, n, H]
    runner = _lean_runner(target, [], fused)  # its first 3 tokens fill an empty cache through the lean path
    runner.forward(ids[:, :3])
    got = [runner.forward(ids[:, i:i + 1])[0] for i in range(3, n - 4)] + [runner.forward(ids[:, n - 4:])[0]]
    torch.testing.assert_close(torch.cat(got, dim=1), want[:, 3:], rtol=1e-4, atol=1e-5)
    assert runner._lean is not None


@PATHS
@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_lean_prompt_in_chunks_equals_one_uncached_forward(tiny_targets, arch, fused):
    """A 37-token prompt runs as 16 + 16 + 5 rows (past the 16-token sliding window); its hidden states and
    captured features equal transformers' forward of the whole sequence, and so does the next token's."""
    target = tiny_targets[arch]
    points = _points(target)
    ids = torch.randint(0, target.model.config.vocab_size, (1, 38), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = decoder_stack(target.model)(input_ids=ids, use_cache=False, output_hidden_states=True)
    hs, want_h = out.hidden_states, out.last_hidden_state  # hs: embed, each layer's output (the last one normed)
    assert all(p.layer + 1 < len(hs) - 1 for p in points[1:-1])
    want_feats = torch.cat([hs[0]] + [hs[p.layer + 1] for p in points[1:-1]], dim=-1)  # [1, 38, (A-1)*H]
    runner = _lean_runner(target, points, fused)
    calls = []
    real = runner._lean.forward
    runner._lean.forward = lambda ids_, *a: calls.append(ids_.shape[1]) or real(ids_, *a)
    h, feats = runner.forward(ids[:, :37])
    h2, feats2 = runner.forward(ids[:, 37:])
    assert calls == [16, 16, 5, 1]
    torch.testing.assert_close(torch.cat([h, h2], 1), want_h, rtol=1e-4, atol=1e-5)
    got = torch.cat([feats, feats2], 1)  # [1, 38, A*H]: embed, the layers, final_norm
    torch.testing.assert_close(got[..., : want_feats.shape[-1]], want_feats, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[..., want_feats.shape[-1]:], want_h, rtol=1e-4, atol=1e-5)


@PATHS
def test_lean_with_biases_equals_transformers(fused):
    """Biases on q/k/v, o and the MLP (Qwen2 has q/k/v biases; Llama configs may set them all)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():  # biases start at zero: give them values
        p.data.normal_(0, 0.2)
    target = SimpleNamespace(model=model)
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    _steps_match_transformers(target, ids, fused)


@pytest.mark.parametrize("head_dim", [12, 64, 72])
def test_lean_head_sizes_equal_transformers(head_dim):
    """The fused attention takes keys eight at a time when the head size is a multiple of 8 and sums values
    64 floats at a time in registers: 64 and 72 (a 64-block and a tail) run those paths with the default
    target's head size, 12 the scalar ones; the tiny targets' 32 only the first."""
    torch.manual_seed(head_dim)
    cfg = LlamaConfig(vocab_size=300, hidden_size=2 * head_dim, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim)
    target = SimpleNamespace(model=LlamaForCausalLM(cfg).eval())
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(4))
    _steps_match_transformers(target, ids, True)


def test_lean_scope(tiny_targets):
    deepseek = tiny_targets["deepseek_v3"]
    why = why_not_lean(decoder_stack(deepseek.model), deepseek.model.config)
    assert why and "DeepseekV3DecoderLayer" in why
    runner = TargetRunner(deepseek, [])
    assert runner.lean_why == why
    runner.forward(torch.tensor([[1, 2, 3]]))
    runner.forward(torch.tensor([[4]]))
    assert runner._lean is None  # it kept the transformers forward
    assert TargetRunner(tiny_targets["llama"], [], fast=False).lean_why.startswith("off")
    llama = tiny_targets["llama"]
    double = decoder_stack(llama.model).embed_tokens.weight.double()
    stack = type("Stack", (), {"layers": decoder_stack(llama.model).layers, "rotary_emb": 0, "norm": 0,
                               "embed_tokens": type("E", (), {"weight": double})()})()
    assert "float64" in why_not_lean(stack, llama.model.config)


def test_layer_windows_follow_the_config(tiny_targets):
    qwen, mistral, llama = (tiny_targets[a].model.config for a in ("qwen3", "mistral", "llama"))
    assert layer_windows(qwen, qwen.num_hidden_layers) == [
        qwen.sliding_window if t == "sliding_attention" else None for t in qwen.layer_types]
    assert set(layer_windows(qwen, qwen.num_hidden_layers)) == {None, 16}
    assert layer_windows(mistral, 8) == [16] * 8
    assert layer_windows(llama, 8) == [None] * 8
