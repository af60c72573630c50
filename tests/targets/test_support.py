"""Which engines capture EAGLE-3 features from which target classes (the examples of issue 52).

The sets themselves are re-derived from the pinned wheels in tests/export/test_vllm_model_files.py;
these cases pin the product's answers for the families users serve.
"""

import pytest

from eaglewire.targets.support import (
    SGLANG_EAGLE3_ARCHS,
    VLLM_EAGLE3_ARCHS,
    VLLM_NO_EAGLE3_ARCHS,
    VLLM_REFUSAL,
    capture_refusal,
    capture_support,
)

pytestmark = pytest.mark.unit

VLLM_YES = ["KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM",
            "Qwen3NextForCausalLM", "Qwen3MoeForCausalLM", "Llama4ForConditionalGeneration",
            "Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "LlamaForCausalLM"]
VLLM_NO = ["Glm4MoeForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"]


@pytest.mark.parametrize("arch", VLLM_YES)
def test_vllm_captures_from_the_families_it_declares(arch):
    assert capture_support("vllm", "0.32.0", arch) == "yes"
    assert capture_refusal("vllm", None, arch) is None


@pytest.mark.parametrize("arch", VLLM_NO)
def test_vllm_refusal_names_the_class_and_quotes_the_runner(arch):
    assert capture_support("vllm", None, arch) == "no"
    line = capture_refusal("vllm", "0.32.0", arch)
    assert arch in line and VLLM_REFUSAL in line and "0.32.0" in line and "\n" not in line


@pytest.mark.parametrize("arch", VLLM_NO)
def test_sglang_captures_where_vllm_refuses(arch):
    assert capture_support("sglang", "0.5.23", arch) == "yes"
    assert capture_refusal("sglang", None, arch) is None


def test_transformers_spelling_of_kimi_k25_is_the_published_class():
    assert capture_support("vllm", None, "Kimi_K25ForConditionalGeneration") == "yes"
    assert capture_support("sglang", None, "Kimi_K25ForConditionalGeneration") == "yes"


def test_sglang_refuses_a_registered_class_without_the_method():
    line = capture_refusal("sglang", "0.5.23", "Glm4ForCausalLM")
    assert "Glm4ForCausalLM" in line and "set_eagle3_layers_to_capture" in line


@pytest.mark.parametrize("engine,version,arch", [
    ("vllm", "0.31.0", "Glm4MoeForCausalLM"),  # a release whose source was not read
    ("vllm", None, "NoSuchForCausalLM"),  # not registered by the pinned release
    ("sglang", None, None),
    ("llama.cpp", "0.3.30", "LlamaForCausalLM"),  # a release whose source was not read
    ("llama.cpp", None, "PhiForCausalLM"),  # a class whose graph was not read
])
def test_unknown_is_said_distinctly(engine, version, arch):
    assert capture_support(engine, version, arch) == "unknown"
    assert capture_refusal(engine, version, arch) is None


def test_speculators_and_specforge_read_as_their_engines():
    assert capture_support("speculators", None, "Gemma3ForCausalLM") == "no"
    assert capture_support("specforge", None, "Gemma3ForCausalLM") == "yes"


def test_sets_are_disjoint_and_sized_as_read():
    assert not VLLM_EAGLE3_ARCHS & VLLM_NO_EAGLE3_ARCHS
    assert (len(VLLM_EAGLE3_ARCHS), len(VLLM_NO_EAGLE3_ARCHS), len(SGLANG_EAGLE3_ARCHS)) == (108, 154, 71)


@pytest.mark.parametrize("arch,support,graph", [
    ("Qwen3MoeForCausalLM", "yes", None), ("GptOssForCausalLM", "yes", None),
    ("KimiK25ForConditionalGeneration", "no", "deepseek2"), ("Kimi_K25ForConditionalGeneration", "no", "deepseek2"),
    ("Gemma3ForConditionalGeneration", "no", "gemma3"),
])
def test_llama_cpp_capture_follows_its_graph(arch, support, graph):
    """llama.cpp feeds a drafter only from graphs that mark t_layer_inp; the refusal names the graph."""
    assert capture_support("llama.cpp", None, arch) == support
    line = capture_refusal("llama.cpp", None, arch)
    assert (line is None) == (graph is None)
    if graph:
        assert f"its {graph} graph" in line and "layer input tensor is null" in line


def test_llama_cpp_graph_facts_match_the_vendored_source():
    """Each class is registered by llama.cpp 0.3.36's converter, and its graph's source marks t_layer_inp
    exactly when the facts say it can feed a drafter (skipped without the managed llama.cpp source; CI
    builds it)."""
    import re

    from eaglewire.engines import llama_env
    from eaglewire.targets.support import LLAMA_CPP_GRAPHS

    root = llama_env.source_dir()
    if not (root / "conversion").is_dir():
        pytest.skip(f"llama.cpp's vendored source is not unpacked at {root}")
    text = "\n".join(p.read_text() for p in (root / "conversion").glob("*.py"))
    for arch, (graph, marks) in LLAMA_CPP_GRAPHS.items():
        assert re.search(rf'"{arch}"', text), f"{arch} is not registered by llama.cpp's converter"
        src = (root / "src" / "models" / f"{graph}.cpp").read_text()
        assert ("t_layer_inp" in src) == marks, f"{graph}.cpp: t_layer_inp {'absent' if marks else 'present'}"
