"""`doctor config --engine sglang` on a DFlash drafter FAILs a target class SGLang cannot feed it from.

Reference, read by hand from SGLang 0.5.23's model files: glm4_moe.py, gemma3_causal.py and qwen2.py define
`set_eagle3_layers_to_capture` but no `set_dflash_layers_to_capture`, so configure_aux_hidden_state_capture
(attention_backend_setup.py) raises "Model <class> implements neither set_dspark_layers_to_capture nor
set_dflash_layers_to_capture"; llama.py and qwen3.py define it. (The whole table is re-derived from the wheel in
tests/targets/test_sglang_dflash_support.py.)
"""

from __future__ import annotations

import json

import pytest

from eaglewire.doctor.engine_config import doctor_config
from eaglewire.drafter.dflash import DFlashConfig
from eaglewire.saved.dflash import zlab_config
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

L = 30
TRAINED = ["layers.1.out", "layers.14.out", "layers.28.out"]
CFG = DFlashConfig(hidden_size=64, intermediate_size=128, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, vocab_size=100, target_layer_ids=(1, 14, 28), mask_token_id=16, block_size=4)


@pytest.fixture
def drafter(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(zlab_config(CFG, L)))
    return d


@pytest.mark.parametrize("engine", ["sglang", "sglang==0.5.23"])
@pytest.mark.parametrize("arch", ["Glm4MoeForCausalLM", "Gemma3ForCausalLM", "Qwen2ForCausalLM"])
def test_sglang_refuses_a_class_without_the_dflash_hook(drafter, engine, arch):
    """Before: the wiring rows said OK and no row named the class (the check ran for vLLM/speculators only)."""
    rep = doctor_config(drafter, engine, L, TRAINED, None, None, arch=arch)
    row = next((c for c in rep.checks if c.name == "target class"), None)
    assert row is not None and not row.ok and rep.exit_code() == 1, rep.to_dict()
    assert arch in row.detail and "set_dflash_layers_to_capture" in row.detail


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_sglang_feeds_a_class_with_the_dflash_hook(drafter, arch):
    rep = doctor_config(drafter, "sglang", L, TRAINED, None, None, arch=arch)
    assert rep.exit_code() == 0 and "target class" not in {c.name for c in rep.checks}, rep.to_dict()


def test_an_unpinned_sglang_version_is_not_judged(drafter):
    """The table is read at 0.5.23 only: another release may define the hook, so no row (unknown, not FAIL)."""
    rep = doctor_config(drafter, "sglang==0.5.22", L, TRAINED, None, None, arch="Glm4MoeForCausalLM")
    assert "target class" not in {c.name for c in rep.checks}


def test_the_cli_names_the_class_of_the_tiny_glm4_moe_family(drafter):
    """tiny:glm4_moe is a Glm4MoeForCausalLM: the CLI's JSON carries the FAIL row and exits 1."""
    r = run_cli("doctor", "config", drafter, "--engine", "sglang", "--arch", "Glm4MoeForCausalLM", "--target-layers",
                str(L), "--trained-points", ",".join(TRAINED), "--json")
    rows = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and rows["target class"]["ok"] is False, r.stdout
    assert "Glm4MoeForCausalLM" in rows["target class"]["detail"]
