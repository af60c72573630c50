"""`plan` for a node owner (issue 57): named devices, the engines' TP/EP/PP rules, DOES NOT FIT with the
smallest setup that fits, and training time from a measured throughput or marked unmeasured."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from eaglewire.plan.config import PlanConfig
from eaglewire.plan.estimate import plan
from eaglewire.plan.hardware import smallest_setup
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

KIMI = Path(__file__).parents[1] / "fixtures" / "real_configs" / "kimi_k25"
KIMI_K2 = Path(__file__).parents[1] / "fixtures" / "real_configs" / "kimi_k2"
GIB = 2**30


@cache
def _plan(cfg: Path = KIMI, device: str = "h200", gpus: int = 8, measured: Path | None = None) -> dict:
    return plan(PlanConfig(hf_config=cfg, device=device, gpus=gpus, samples=1000, seq_len=2048, vocab_size=32000,
                           measured=measured))


def test_kimi_k25_fits_one_8xh200_node_with_tp8_ep8():
    """Issue 57's done-when: int4 experts (553 GiB) over 8 x 139.8 GiB: 69 GiB of weights per device + MLA's
    latent cache for 64 x 2048 tokens (8.6 GiB, on every TP rank) + 2 GiB, inside 90% of 139.8."""
    r = _plan()
    p = r["engine"]["setup"]
    assert r["engine"]["fits_gpus"] and r["run"]["device_name"] == "h200" and not r["run"]["device_assumed"]
    assert (p["tensor_parallel_size"], p["expert_parallel_size"], p["pipeline_parallel_size"], p["nodes"]) == (8, 8, 1, 1)
    c = r["capture"]
    assert (c["path"], c["tensor_parallel_size"]) == ("vllm", 8) and "--enable-expert-parallel" in c["command"]
    assert r["fits_one_device"]["generate"] and r["fits_one_device"]["extract"]
    assert r["host_memory"]["train"] < 64 * GIB  # the drafter's run, not the 3.74 TiB whole target in fp32


def test_kimi_k2_fp8_needs_16_h200_as_moonshot_deploys_it():
    """Kimi-K2's fp8 block weights (~960 GiB): Moonshot's deploy guidance names 16 H200 as the smallest unit.
    TP stays inside the 8-GPU node and PP spans two."""
    p = _plan(KIMI_K2)["engine"]["setup"]
    assert (p["tensor_parallel_size"], p["pipeline_parallel_size"], p["devices"], p["nodes"]) == (8, 2, 16, 2)


def test_does_not_fit_names_the_smallest_setup_that_fits():
    """8 x H100 (79.6 GiB, 71.6 usable): 69 + 8.6 + 2 GiB per device does not fit; PP 2 over two nodes does."""
    r = run_cli("plan", "--model-config", KIMI, "--device", "h100", "--gpus", "8", "--samples", "1000",
                "--vocab-size", "32000")
    assert r.returncode == 0, r.stderr
    assert "DOES NOT FIT on --gpus 8: needs 16, TP 8 x EP 8 x PP 2 = 16 device(s), 2 node(s)" in r.stdout


def test_a_bare_cuda_device_says_which_gpu_it_assumed():
    r = run_cli("plan", "--target", "tiny:llama", "--device", "cuda", "--samples", "10", "--seq-len", "64")
    assert r.returncode == 0, r.stderr
    assert "ASSUMED an H100" in r.stdout and "--device h100|h200|b200" in r.stdout and "H100 (ASSUMED)" in r.stdout


def _shape(heads: int, kv: int, experts: int = 0, mla: bool = False) -> dict:
    return {"num_heads": heads, "num_kv_heads": kv, "num_experts": experts, "num_layers": 40, "mla": mla}


@pytest.mark.parametrize("heads,kv,devices,tp", [
    (48, 48, 5, 6),  # 48 heads split over 6 (not the next power of two, 8)
    (40, 8, 5, 8),  # 5 divides 40 heads, but 8 KV heads cannot be split or replicated over 5
    (24, 8, 3, 4),  # 3 divides 24, not 8
    (64, 4, 5, 8),  # 4 KV heads replicated twice over 8
])
def test_tensor_parallel_follows_vllms_head_rules(heads, kv, devices, tp):
    """vLLM refuses TP that does not divide the attention heads (verify_with_parallel_config) and splits or
    replicates KV heads by whole factors (QKVParallelLinear): the smallest TP holding weights/`devices`."""
    mem = 100 * GIB
    weights = int((devices - 0.5) * (mem * 0.9 - 2 * GIB))  # needs just under `devices` devices
    p = smallest_setup(_shape(heads, kv), weights, 0, mem, 8)
    assert p["tensor_parallel_size"] == tp and p["pipeline_parallel_size"] == 1


def test_expert_parallel_only_when_the_experts_divide_the_group():
    mem = 100 * GIB
    assert smallest_setup(_shape(64, 64, 384, True), int(5 * 80 * GIB), 0, mem, 8)["expert_parallel_size"] == 8
    assert smallest_setup(_shape(64, 64, 60, True), int(5 * 80 * GIB), 0, mem, 8)["expert_parallel_size"] == 1


def _measured(tmp_path, matmul: int, rate: float) -> Path:
    tmp_path.mkdir(exist_ok=True)
    p = tmp_path / "gpu_check.json"
    p.write_text(json.dumps({"device": "NVIDIA H200", "train": {"tokens_per_s": rate, "matmul_parameters": matmul,
                                                                "ttt_steps": 7, "dtype": "bf16"}}))
    return p


def test_training_time_comes_from_a_measured_throughput(tmp_path):
    """With a gpu_check result for this very drafter, training time is tokens / measured rate; a drafter with
    half the matmul weights of the measured one trains twice as fast. No flat fraction of the peak."""
    d = _plan()["drafter"]
    same = _plan(measured=_measured(tmp_path / "a", d["matmul_parameters"], 5000.0))
    double = _plan(measured=_measured(tmp_path / "b", 2 * d["matmul_parameters"], 5000.0))
    assert same["time"]["offline"]["train_h"] == pytest.approx(1000 * 2048 / 5000.0 / 8 / 3600)
    assert double["time"]["offline"]["train_h"] == pytest.approx(same["time"]["offline"]["train_h"] / 2)
    assert same["time"]["train_basis"] == "measured" and not same["time"]["train_is_lower_bound"]
    assert any("measured 5,000 tok/s on NVIDIA H200" in a for a in same["assumptions"])


def test_without_a_measurement_gpu_training_time_is_marked_unmeasured(tmp_path):
    r = _plan()
    assert r["time"]["train_basis"] == "unmeasured" and r["time"]["train_is_lower_bound"]
    assert any(a.startswith("training: UNMEASURED on h200") for a in r["assumptions"])
    out = run_cli("plan", "--model-config", KIMI, "--device", "h200", "--gpus", "8", "--samples", "1000").stdout
    assert "train UNMEASURED" in out and "train >= " in out


def test_a_bad_measured_file_is_one_line(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('{"train": {"tokens_per_s": -1}}')
    r = run_cli("plan", "--target", "tiny:llama", "--device", "h200", "--measured", bad)
    assert r.returncode == 2 and r.stderr.strip().startswith(f"error: --measured {bad}: expected a benchmarks/gpu_check.py")
    assert len(r.stderr.strip().splitlines()) == 1
