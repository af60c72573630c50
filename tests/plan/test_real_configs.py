"""The targets people serve, as their published config.json (tests/fixtures/real_configs, sources in SOURCES.md).

No weights: each fixture is the real checkpoint's config as published, so depth, hidden size, ids per engine
and `plan`'s sizes are checked on the real shapes (Kimi-K2.5's 61 layers under a wrapper, MLA, hybrid linear
attention, Llama-4's interleaved MoE, GPT-OSS's biases and sinks) against independent references: the
parameter counts the model cards publish, and the engines' own id rules for the serving architecture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.targets.points import Engine, eagle3_default, ids_for_points, points_from_ids

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "real_configs"


@dataclass(frozen=True)
class Published:
    """What the model card says (SOURCES.md), and the SGLang rule its serving class follows."""

    arch: str  # architectures[0]: what the engines dispatch on
    layers: int  # the language model's decoder layers (MTP / next-n layers excluded)
    hidden: int
    vocab: int
    total_b: float  # published total parameters, billions
    active_b: float  # published active parameters per token, billions
    sglang_first_id: bool  # SGLang >= 0.5.13 serves it through deepseek_v2.py's first-id-conditional +1


FAMILIES = {
    "kimi_k25": Published("KimiK25ForConditionalGeneration", 61, 7168, 163840, 1000, 32, True),
    "kimi_k2": Published("DeepseekV3ForCausalLM", 61, 7168, 163840, 1000, 32, True),
    "deepseek_v32": Published("DeepseekV32ForCausalLM", 61, 7168, 129280, 671, 37, True),
    "gpt_oss_120b": Published("GptOssForCausalLM", 36, 2880, 201088, 117, 5.1, False),
    "qwen3_235b_a22b": Published("Qwen3MoeForCausalLM", 94, 4096, 151936, 235, 22, False),
    "qwen3_5_397b_a17b": Published("Qwen3_5MoeForConditionalGeneration", 60, 4096, 248320, 397, 17, False),
    "glm4_6": Published("Glm4MoeForCausalLM", 92, 5120, 151552, 355, 32, False),
    "minimax_m2": Published("MiniMaxM2ForCausalLM", 62, 3072, 200064, 230, 10, False),
    "llama4_maverick": Published("Llama4ForConditionalGeneration", 48, 5120, 202048, 400, 17, False),
    "qwen3_vl_235b_a22b": Published("Qwen3VLMoeForConditionalGeneration", 94, 4096, 151936, 235, 22, False),
}
# Published totals are rounded ("1T", "355B") and some include a next-token-prediction layer the language
# model does not build. Publishers count active parameters with or without the input embedding table (a
# lookup, no compute: OpenAI's 5.13B for gpt-oss-120b leaves it out, Meta's 17B for Maverick keeps it), so
# the plan's active count must match the card under one of the two. Both within 5%: a routed expert counted
# as always active, a wrapper's vision tower or a missing shared expert moves one of them by far more.
TOLERANCE = 0.05


@cache  # one plan per fixture for the whole module (each test only reads it)
def _plan(fixture: str) -> dict:
    r = CliRunner().invoke(app, ["plan", "--model-config", str(FIXTURES / fixture), "--device", "cuda",
                                 "--samples", "10", "--seq-len", "64", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _raw(fixture: str) -> dict:
    return json.loads((FIXTURES / fixture / "config.json").read_text())


def test_every_fixture_is_listed_with_its_source():
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(FAMILIES)
    for name, pub in FAMILIES.items():
        assert f"`{name}/`" in sources, name
        assert _raw(name)["architectures"] == [pub.arch]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plan_sizes_the_language_model_as_published(name):
    pub = FAMILIES[name]
    t = _plan(name)["target"]
    assert (t["num_layers"], t["hidden_size"], t["vocab_size"]) == (pub.layers, pub.hidden, pub.vocab)
    assert t["method"].startswith("meta-device"), t["method"]  # transformers' own classes, never checkpoint code
    total_b = t["num_parameters"] / 1e9
    with_embed = t["active_parameters"] / 1e9
    without_embed = with_embed - t["vocab_size"] * t["hidden_size"] / 1e9
    assert abs(total_b - pub.total_b) <= TOLERANCE * pub.total_b, (total_b, pub.total_b)
    assert min(abs(with_embed - pub.active_b), abs(without_embed - pub.active_b)) <= TOLERANCE * pub.active_b, (
        with_embed, without_embed, pub.active_b)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_fallback_formula_agrees_with_transformers(name):
    """The formula sizes what transformers cannot build (a remote-code variant of these families): on each
    published family it must land on the meta-device count (MLA, indexer, linear attention, interleaved MoE,
    shared experts, biases and sinks included)."""
    t = _plan(name)["target"]
    assert t["formula_parameters"] == t["num_parameters"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_ids_per_engine_on_the_serving_architecture(name):
    """A drafter published with SGLang ids [2, L//2, L-3]: DeepSeek-family serving classes (Kimi-K2.5, Kimi-K2
    as DeepseekV3ForCausalLM, DeepSeek-V3.2) read them one layer shallower on SGLang 0.5.23, every other class
    as the output of layer i; vLLM always reads id i as layer i's input."""
    pub = FAMILIES[name]
    L = pub.layers
    ids = [2, L // 2, L - 3]
    shift = 1 if pub.sglang_first_id else 0
    sglang = points_from_ids(ids, Engine("sglang", "0.5.23", pub.arch), L)
    assert [p.name for p in sglang] == [f"layers.{i - shift}.out" for i in ids]
    vllm = points_from_ids(ids, "vllm", L)
    assert [p.name for p in vllm] == [f"layers.{i - 1}.out" for i in ids]
    # EAGLE-3's default triple, written for each engine, reads back as the same layers
    pts = eagle3_default(L)
    assert [p.name for p in pts] == [f"layers.{i - 1}.out" for i in ids]
    for eng in (Engine("sglang", "0.5.23", pub.arch), Engine("sglang", "0.5.12.post1", pub.arch),
                Engine("vllm", "0.32.0"), Engine("hf")):
        back = points_from_ids(ids_for_points(pts, eng, L), eng, L)
        assert back == pts, eng


def test_kimi_k25_under_transformers_class_name_reads_sglang_ids_as_the_checkpoint_does():
    """transformers names the wrapper Kimi_K25ForConditionalGeneration; SGLang dispatches on the published
    KimiK25ForConditionalGeneration. `layers --arch` with either reads [2, 30, 58] as layers.1/29/57.out."""
    for arch in ("Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration"):
        r = CliRunner().invoke(app, ["layers", "2", "30", "58", "--layers-from", "sglang==0.5.23", "--target-layers", "61",
                                     "--arch", arch, "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["names"] == ["layers.1.out", "layers.29.out", "layers.57.out"], arch


@pytest.mark.parametrize("name", ["kimi_k25", "qwen3_5_397b_a17b", "llama4_maverick", "kimi_k2"])
def test_inspect_describes_the_language_model_from_the_config_alone(name):
    """Wrappers keep the language model one level down; `inspect` on a weights-free directory reports its
    depth and width, the wrapper as the architecture, and on the hybrid target which captured layers are
    linear attention (Qwen3.5: every fourth layer is full attention)."""
    pub = FAMILIES[name]
    r = CliRunner().invoke(app, ["inspect", "--target", str(FIXTURES / name), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])  # after the "holds no weights" note
    assert (res["num_layers"], res["hidden_size"], res["vocab_size"]) == (pub.layers, pub.hidden, pub.vocab)
    assert res["architecture"] == pub.arch
    if name == "qwen3_5_397b_a17b":
        kinds = _raw(name)["text_config"]["layer_types"]
        assert res["layer_types"] == {p: kinds[int(p.split(".")[1])] for p in res["default_capture"]["names"]}
        assert set(res["layer_types"].values()) == {"linear_attention"}  # layers 1, 29, 56: none is 3 mod 4


def test_hybrid_kv_cache_counts_only_full_attention_layers(tmp_path):
    """Qwen3.5's linear-attention layers keep a fixed-size state, not a per-token cache: the plan's KV cache
    must equal the cache a real forward builds (a tiny Qwen3.5-MoE text model, three linear layers and one
    full-attention layer, as the real one alternates them), and its formula the real parameter count."""
    from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig

    from eaglewire.plan.config import PlanConfig
    from eaglewire.plan.estimate import plan

    cfg = Qwen3_5MoeTextConfig(vocab_size=128, hidden_size=32, num_hidden_layers=8, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=16, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
    cfg.to_json_file(str(tmp_path / "config.json"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)  # allocated for real (tiny): the reference
    B, T = 3, 20
    with torch.no_grad():
        kv = model(torch.randint(0, 128, (B, T)), use_cache=True).past_key_values
    real_kv = sum(x.numel() * x.element_size() for layer in kv.layers if hasattr(layer, "keys")
                  for x in (layer.keys, layer.values))
    r = plan(PlanConfig(hf_config=tmp_path / "config.json", samples=10, seq_len=T, gen_batch_size=B, device="cpu"))
    assert r["device_memory"]["generate_kv_cache"] == real_kv
    real = sum(p.numel() for p in model.parameters())
    assert r["target"]["num_parameters"] == real and r["target"]["formula_parameters"] == real
