"""Exports for a target class the engine cannot serve are refused in one line, before anything is written.

References are the engines' sources, written out here: vLLM 0.32.0 stops at startup on a target class without
SupportsEagle3 (GLM-4-MoE, Gemma-3); llama.cpp 0.3.36 aborts at the first decode on a graph that marks no layer
inputs (deepseek2 for Kimi/DeepSeek-V3, deepseek32, glm4-moe, llama4, qwen3vl, gemma3: no
`res->t_layer_inp[il] = ...` in their src/models/*.cpp), and feeds them from qwen3moe, openai-moe, minimax-m2,
qwen3next and qwen35.
"""

from __future__ import annotations

import pytest

from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.gguf import refusals
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.export_helpers import L, make_drafter, provenance

pytestmark = pytest.mark.unit


def _ckpt(path, arch: str):
    from eaglewire.saved.checkpoint import save_checkpoint

    fp = TargetFingerprint(num_layers=L, model_type="x", config_sha="test-drafter", arch=arch)
    save_checkpoint(path, make_drafter(), provenance([p.name for p in eagle3_default(L)], L, fingerprint=fp))
    return path


@pytest.mark.parametrize("arch,graph", [
    ("KimiK25ForConditionalGeneration", "deepseek2"), ("Kimi_K25ForConditionalGeneration", "deepseek2"),
    ("DeepseekV3ForCausalLM", "deepseek2"), ("DeepseekV32ForCausalLM", "deepseek32"),
    ("Glm4MoeForCausalLM", "glm4-moe"), ("Llama4ForConditionalGeneration", "llama4"),
    ("Qwen3VLForConditionalGeneration", "qwen3vl"), ("Gemma3ForConditionalGeneration", "gemma3")])
def test_llamacpp_refuses_a_target_whose_graph_marks_no_layer_inputs(arch, graph):
    why = refusals(make_drafter().config, eagle3_default(L), L, arch)
    assert len(why) == 1 and f"its {graph} graph" in why[0] and "layer input tensor is null" in why[0]
    assert "KimiK25ForConditionalGeneration" in why[0] if "Kimi" in arch else arch in why[0]


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM",
                                  "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "LlamaForCausalLM", None])
def test_llamacpp_serves_the_graphs_that_mark_them(arch):
    assert refusals(make_drafter().config, eagle3_default(L), L, arch) == []


def test_gguf_export_refuses_before_the_converter_and_writes_nothing(tmp_path):
    ck = _ckpt(tmp_path / "ck", "DeepseekV32ForCausalLM")
    with pytest.raises(EaglewireError, match=r"ck: cannot export for llama\.cpp: .*DeepseekV32ForCausalLM") as e:
        run_export(ExportConfig(ckpt=ck, format="gguf", out=tmp_path / "g", verifier="tiny:llama"))
    assert "\n" not in str(e.value) and not (tmp_path / "g").exists()


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_a_vllm_export_for_a_class_vllm_refuses_is_refused(tmp_path, fmt):
    ck = _ckpt(tmp_path / "ck", "Glm4MoeForCausalLM")
    with pytest.raises(EaglewireError, match=rf"ck: cannot export to {fmt}: vllm 0.32.0 cannot capture EAGLE-3 "
                                             r"features from Glm4MoeForCausalLM.*does not support EAGLE3") as e:
        run_export(ExportConfig(ckpt=ck, format=fmt, out=tmp_path / "o", verifier="org/target"))
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()
    # SGLang captures from it: the same checkpoint exports
    assert run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))["ids"] == [1, 3, 4]


def test_an_unread_vllm_version_is_not_refused(tmp_path):
    ck = _ckpt(tmp_path / "ck", "Glm4MoeForCausalLM")
    out = run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "o", engine_version="0.99.0"))
    assert out["ids"] == [2, 4, 5]
