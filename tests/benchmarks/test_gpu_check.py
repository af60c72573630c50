"""benchmarks/gpu_check.py, the prepared GPU check (issue 57), in its CPU smoke mode: every section runs and its
result is what `plan --measured` reads, so the figures a lent GPU produces time training in `plan`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from eaglewire.plan.config import PlanConfig
from eaglewire.plan.estimate import plan

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tiny_targets) -> dict:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("gpu_check") / "result.json"
    assert mod.main(["--smoke", "--device", "cpu", "--out", str(out)]) == 0
    return {"path": out, "result": json.loads(out.read_text()), "sizes": mod.SMOKE}


def test_the_smoke_run_trains_decodes_exactly_and_captures(smoke):
    r, s = smoke["result"], smoke["sizes"]
    t = r["train"]
    assert t["ok"] and t["tokens_per_s"] > 0 and t["dtype"] == "bf16" and len(t["losses"]) == s["warmup"] + s["steps"]
    H, ffn, q, D = s["hidden"], s["intermediate"], s["heads"] * s["head_dim"], s["draft_vocab"]
    # fc over 3 captured slots, q/k/v over [embedding, hidden] (2H), o, gated MLP, lm_head over the draft vocab
    assert t["matmul_parameters"] == 3 * H * H + 3 * 2 * H * q + q * H + 3 * H * ffn + D * H
    assert r["exact"]["ok"] and {c["mode"] for c in r["exact"]["cases"]} == {"chain", "tree"}
    assert r["capture"]["ok"] and set(r["capture"]["families"]) == {"llama", "qwen3", "deepseek_v3"}


def test_plan_reads_the_result_as_a_measured_training_rate(smoke):
    t = smoke["result"]["train"]
    r = plan(PlanConfig(target="tiny:llama", device="h200", samples=10, seq_len=64, ttt_steps=t["ttt_steps"],
                        measured=smoke["path"]))
    assert r["time"]["train_basis"] == "measured"
    scaled = t["tokens_per_s"] * t["matmul_parameters"] / r["drafter"]["matmul_parameters"]
    assert r["time"]["offline"]["train_h"] == pytest.approx(10 * 64 / scaled / 3600)  # 10 samples x 64 tokens
