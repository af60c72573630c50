"""`doctor config --engine llama.cpp` names a target class whose llama.cpp graph cannot feed an EAGLE-3 drafter.

Reference: llama.cpp 0.3.36's src/models/deepseek2.cpp marks no `t_layer_inp` (the first decode aborts with
"layer input tensor is null"), qwen3moe.cpp does (`res->t_layer_inp[il] = inpL`).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFWriter

from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit


@pytest.fixture
def drafter_gguf(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    w = GGUFWriter(str(d / "drafter.gguf"), "eagle3")
    w.add_array("eagle3.target_layers", [2, 4, 5])
    w.add_tensor("fc.weight", np.zeros((4, 12), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d


def _checks(d, arch):
    r = run_cli("doctor", "config", d, "--engine", "llama.cpp", "--arch", arch, "--target-layers", 8,
                "--trained-points", "layers.1.out,layers.3.out,layers.4.out", "--json")
    return {c["name"]: c for c in json.loads(r.stdout)["checks"]}, r


def test_a_deepseek_family_target_is_named_as_one_llamacpp_cannot_feed(drafter_gguf):
    checks, r = _checks(drafter_gguf, "DeepseekV3ForCausalLM")
    c = checks["target class"]
    assert not c["ok"] and "DeepseekV3ForCausalLM" in c["detail"] and "deepseek2 graph" in c["detail"]
    assert r.returncode == 1


def test_a_qwen3_moe_target_gets_no_such_line(drafter_gguf):
    checks, _ = _checks(drafter_gguf, "Qwen3MoeForCausalLM")
    assert "target class" not in checks and checks  # the GGUF's own checks ran
