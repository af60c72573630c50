"""`serve --print-command` for another machine: a drafter that does not fit the target is refused (the target
may be only a config.json there), and a target too big for one device gets the tensor-parallel size plan finds."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from eaglewire.serve.fit import tensor_parallel
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

# Llama-3.1-70B's shape (config only: nothing here is loaded): bf16 weights ~141 GB, more than one H100 holds
BIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
       "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
       "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
       "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big") / "Llama-70B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(BIG))
    return d


@pytest.fixture
def run(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    shutil.copytree(ckpt, tmp_path / "run" / "drafter")
    return tmp_path / "run"


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llama.cpp"])
def test_a_drafter_for_another_target_is_refused_in_one_line(run, big, engine):
    """Before: the command was printed (the drafter, trained on a tiny llama, would load onto a 70B target)."""
    r = run_cli("serve", run, "--print-command", "--engine", engine, "--target", big)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: drafter {run}") and f"does not fit target {big}" in line
    assert "hidden size 8192" in line and "vocabulary 128256" in line


def test_the_tensor_parallel_size_comes_from_plans_sizing(big):
    """141 GB of bf16 weights plus the KV cache: two H200 (139.8 GiB each), more H100; --tp wins."""
    assert tensor_parallel(str(big), 0, "h200")[0] == 2
    tp, how = tensor_parallel(str(big), 0, "h100")
    assert tp == 4 and "plan's sizing for h100" in how
    assert tensor_parallel(str(big), 8, "h100") == (8, "--tp")


@pytest.mark.parametrize("engine, flag", [("vllm", "--tensor-parallel-size"), ("sglang", "--tp-size")])
def test_tp_is_printed_in_each_engines_flag(run, engine, flag):
    r = run_cli("serve", run, "--print-command", "--engine", engine, "--tp", "4", "--json")
    assert r.returncode == 0, r.stderr
    cmd = shlex.split(json.loads(r.stdout)["command"])
    assert cmd[cmd.index(flag) + 1] == "4"
    r = run_cli("serve", run, "--print-command", "--engine", engine, "--json")  # a tiny target fits one device
    assert r.returncode == 0 and flag not in json.loads(r.stdout)["command"], r.stderr


def test_a_target_one_node_cannot_hold_is_refused_not_printed_at_tp_alone():
    """Kimi-K2.5 (int4 experts) on 8 x H100 needs PP 2 across two nodes: a one-node command at TP 8 would run
    out of memory, so the sizing refuses in one line; 8 x H200 holds it at TP 8."""
    from pathlib import Path

    from eaglewire.infra.errors import EaglewireError

    kimi = Path(__file__).resolve().parents[1] / "fixtures" / "real_configs" / "kimi_k25"
    with pytest.raises(EaglewireError, match=r"one node of h100 does not hold it .*PP 2"):
        tensor_parallel(str(kimi), 0, "h100")
    assert tensor_parallel(str(kimi), 0, "h200")[0] == 8
    assert tensor_parallel(str(kimi), 8, "h100") == (8, "--tp")


@pytest.mark.parametrize("fixture, device", [("big", "h100"), ("big", "h200"), ("kimi_k2", "h200"),
                                             ("qwen3_5_397b_a17b", "h100"), ("gpt_oss_120b", "h100")])
def test_the_setup_serve_sizes_is_plans_own(big, fixture, device):
    """`serve`'s sizing (plan.estimate.serving_setup) is the engine setup the whole `plan` reports for the same
    target and device: dense, MoE with MLA, hybrid linear attention, quantized MoE."""
    from pathlib import Path

    from eaglewire.plan.config import PlanConfig
    from eaglewire.plan.estimate import plan, serving_setup

    src = str(big) if fixture == "big" else str(Path(__file__).parents[1] / "fixtures" / "real_configs" / fixture)
    cfg = PlanConfig(target=src, device=device)
    assert serving_setup(cfg) == plan(cfg)["engine"]
