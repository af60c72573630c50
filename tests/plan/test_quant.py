"""`plan` reads the checkpoint's quantization_config (issue 57): bytes per weight group, checked on the real
configs against hand arithmetic over their published geometry and against what their publishers say fits."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from eaglewire.plan.config import PlanConfig
from eaglewire.plan.estimate import plan
from eaglewire.plan.quant import quantization_config, scheme

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "real_configs"
GIB = 2**30


@cache
def _plan(fixture: str, device: str = "h200", gpus: int = 8) -> dict:
    return plan(PlanConfig(hf_config=FIXTURES / fixture, device=device, gpus=gpus, samples=10, seq_len=2048,
                           vocab_size=32000))


def test_kimi_k25_int4_experts_are_counted_at_int4_and_the_rest_at_bf16():
    """compressed-tensors int4, group 32, one bf16 scale per group: 0.5 + 2/32 B per routed-expert weight;
    its ignore list keeps attention, shared experts, the dense first layer and lm_head in bf16."""
    t = _plan("kimi_k25")["target"]
    routed = (61 - 1) * 384 * 3 * 7168 * 2048  # 60 MoE layers (first_k_dense_replace 1) x 384 experts x gate/up/down
    assert t["routed_expert_parameters"] == routed
    # the whole language model by hand from the published config: per layer MLA (q_a, its norm, q_b over
    # nope+rope, kv_a over latent+rope, its norm, kv_b, o) and two norms; one dense MLP; 60 MoE layers of
    # 384 routed + 1 shared expert and a router; untied embedding and head, the final norm. (The router's
    # e_score_correction_bias is a buffer in transformers, not counted.)
    H, V, nh, ql, kl, rope, nope, vd = 7168, 163840, 64, 1536, 512, 64, 128, 128
    mla = H * ql + ql + ql * nh * (nope + rope) + H * (kl + rope) + kl + kl * nh * (nope + vd) + nh * vd * H
    total = 2 * V * H + H + 61 * (mla + 2 * H) + 3 * H * 18432 + 60 * (385 * 3 * H * 2048 + H * 384)
    assert t["num_parameters"] == total == 1_026_408_209_408
    assert t["weight_bytes"] == routed * (0.5 + 2 / 32) + (total - routed) * 2 == 594_205_259_776
    assert t["weight_groups"]["routed_experts"]["quantized"]
    assert not any(t["weight_groups"][g]["quantized"] for g in ("attention", "rest", "embed", "lm_head"))
    assert 540 * GIB < t["weight_bytes"] < 570 * GIB  # not the 1.9 TiB of a bf16 count


def test_fp8_block_checkpoints_are_one_byte_plus_a_scale_per_128x128_block():
    """DeepSeek-V3.2: every Linear in fp8 with one fp32 scale per 128 x 128 block; embedding and lm_head bf16."""
    t = _plan("deepseek_v32")["target"]
    VH = t["vocab_size"] * t["hidden_size"]
    expect = (t["num_parameters"] - 2 * VH) * (1 + 4 / (128 * 128)) + 2 * VH * 2
    assert t["weight_bytes"] == pytest.approx(expect, rel=1e-3)  # norms ride at fp8 in the estimate (a few MB)
    assert t["weight_groups"]["attention"]["quantized"] and not t["weight_groups"]["lm_head"]["quantized"]


def test_gpt_oss_mxfp4_experts_fit_one_80gb_gpu_as_openai_says():
    """gpt-oss-120b: MXFP4 experts (4 bits + an e8m0 scale per 32), attention and router bf16. Its model card:
    "fits into a single 80GB GPU" (H100): TP 1, with the KV cache of 16 sequences of 2048 tokens beside it."""
    r = plan(PlanConfig(hf_config=FIXTURES / "gpt_oss_120b", device="h100", samples=10, seq_len=2048,
                        gen_batch_size=16, vocab_size=32000))
    t = r["target"]
    routed = t["routed_expert_parameters"]
    assert t["weight_bytes"] == routed * (0.5 + 1 / 32) + (t["num_parameters"] - routed) * 2
    assert r["engine"]["fits_gpus"] and r["engine"]["setup"]["tensor_parallel_size"] == 1


def test_nvfp4_modelopt_is_half_a_byte_plus_an_fp8_scale_per_16(tmp_path):
    """ModelOpt NVFP4 (as nvidia's DeepSeek-R1-FP4 ships): experts and MLPs 4-bit with an fp8 scale per 16,
    attention excluded by a glob."""
    raw = json.loads((FIXTURES / "kimi_k2" / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    t = plan(PlanConfig(hf_config=tmp_path, device="b200", samples=10, seq_len=64, vocab_size=32000))["target"]
    g = t["weight_groups"]
    four_bit = g["routed_experts"]["parameters"] + g["rest"]["parameters"]
    assert t["weight_bytes"] == four_bit * (0.5 + 1 / 16) + (t["num_parameters"] - four_bit) * 2
    assert not g["attention"]["quantized"] and g["rest"]["quantized"]  # shared experts and dense MLP: 4-bit


def test_an_unknown_quantization_is_sized_bf16_and_says_so():
    s = scheme({"quant_method": "somebody_elses"})
    assert s["bytes"] == 2 and "'somebody_elses' is not read by plan: sized as bf16" in s["note"]
    assert scheme(None)["name"] == "none"
    # a wrapper (Kimi-K2.5) keeps it under text_config
    assert quantization_config({"text_config": {"quantization_config": {"quant_method": "fp8"}}}) == {
        "quant_method": "fp8"}


@pytest.mark.parametrize("q,msg", [
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": "four"}}}},
     "quantization_config weights.num_bits = 'four': expected a positive number"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 0}, "quantization_config group_size = '0'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": float("inf")}, "quantization_config group_size = 'inf'"),
])
def test_a_bad_quantization_field_is_one_line(tmp_path, q, msg):
    raw = json.loads((FIXTURES / "kimi_k2" / "config.json").read_text())
    raw["quantization_config"] = q
    (tmp_path / "config.json").write_text(json.dumps(raw))
    from eaglewire_testing.cli import run_cli

    r = run_cli("plan", "--model-config", tmp_path, "--device", "h200")
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
