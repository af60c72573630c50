"""`doctor config` FAILs where the engine cannot capture from the target's class at all.

vLLM 0.32.0's Glm4MoeForCausalLM and Gemma-3 classes lack SupportsEagle3, so vLLM stops at startup
("Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"); SGLang 0.5.23
captures from both. The facts are read from the pinned engines' source (tests/export/test_vllm_model_files.py).
"""

from __future__ import annotations

import json

import pytest

from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit


@pytest.fixture
def drafter(tmp_path):
    d = tmp_path / "drafter"
    d.mkdir()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 384, "draft_vocab_size": 384,
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _rows(d, engine, arch):
    r = run_cli("doctor", "config", d, "--engine", engine, "--arch", arch, "--target-layers", "8",
                "--trained-points", "layers.1.out,layers.3.out,layers.4.out", "--json")
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)["checks"]}


@pytest.mark.parametrize("arch", ["Glm4MoeForCausalLM", "Gemma3ForConditionalGeneration"])
def test_vllm_refused_target_class_fails(drafter, arch):
    code, rows = _rows(drafter, "vllm==0.32.0", arch)
    assert code == 1 and rows["target class"]["level"] == "error" and rows["target class"]["ok"] is False
    assert "does not support EAGLE3 interface" in rows["target class"]["detail"]


def test_a_class_the_engine_captures_from_has_no_such_row(drafter):
    code, rows = _rows(drafter, "sglang==0.5.23", "Glm4MoeForCausalLM")
    assert "target class" not in rows
    code, rows = _rows(drafter, "vllm==0.32.0", "Qwen3MoeForCausalLM")
    assert code == 0 and "target class" not in rows
