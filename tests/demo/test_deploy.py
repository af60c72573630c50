"""Issue 52: an export the target's engine refuses is stated in the report, engine and reason, not left out."""

from __future__ import annotations

import pytest

from eaglewire_testing.demo_data import synthetic_log

pytestmark = pytest.mark.unit

VLLM = ("run/train/drafter: cannot export to vllm: vllm 0.32.0 cannot capture EAGLE-3 features from "
        "Glm4MoeForCausalLM: the model class lacks SupportsEagle3")
LLAMA = "llama.cpp 0.3.36 cannot capture EAGLE-3 features from KimiK25ForConditionalGeneration: its deepseek2 graph"


def test_refused_exports_name_their_engine_and_why(make_run):
    log = synthetic_log()
    log["doctor"]["refused"] = [{"format": "vllm", "engine": "vllm", "refusal": VLLM}]
    log["llamacpp"] = {"skipped": f"llama.cpp cannot take this target or drafter: {LLAMA}", "refused": LLAMA}
    rows = (make_run(log=log, exports=("sglang",))).joinpath("report.md").read_text().splitlines()
    assert f"| Export for vllm | refused, nothing written: {VLLM} |" in rows
    assert f"| Export for gguf (llama.cpp) | refused, nothing written: {LLAMA} |" in rows
    assert not [r for r in rows if r.startswith("| Check a deployment (vllm)")]
