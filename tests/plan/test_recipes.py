"""recipes/: each recipe's values load as the command's own config, and `plan` checks the Kimi-K2.5 recipe
on the real Kimi-K2.5 config (issue 57): one 8 x H200 node, TP 8 / EP 8, the published drafter's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.infra.options import load_config_file
from eaglewire.plan.config import PlanConfig
from eaglewire.training.config import TrainConfig
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
RECIPES = ROOT / "recipes"
KIMI = ROOT / "tests" / "fixtures" / "real_configs" / "kimi_k25"


@pytest.mark.parametrize("name", ["train-gpu.json", "kimi-k25-8xh200.json"])
def test_every_training_recipe_loads_as_trains_config_and_is_explained(name):
    values = load_config_file(TrainConfig, RECIPES / name)
    readme = (RECIPES / "README.md").read_text()
    assert f"## `{name}`" in readme
    section = readme.split(f"## `{name}`")[1].split("\n## ")[0]
    for key in values:  # each value is stated and reasoned in the table
        assert f"| `{key}` |" in section, (name, key)


def test_the_kimi_recipe_fits_one_8xh200_node_as_plan_sizes_it():
    train = load_config_file(TrainConfig, RECIPES / "kimi-k25-8xh200.json")
    sized = load_config_file(PlanConfig, RECIPES / "kimi-k25-8xh200.plan.json")
    for key in ("epochs", "batch_size", "ttt_steps", "max_len", "intermediate_size"):  # plan sizes the run train makes
        assert sized[key] == train[key], key
    r = run_cli("plan", "--model-config", KIMI, "--config", RECIPES / "kimi-k25-8xh200.plan.json", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    setup = p["engine"]["setup"]
    assert p["run"]["device_name"] == "h200" and p["engine"]["fits_gpus"]
    assert (setup["tensor_parallel_size"], setup["expert_parallel_size"], setup["nodes"]) == (8, 8, 1)
    assert p["capture"]["path"] == "vllm" and p["capture"]["tensor_parallel_size"] == 8
    assert all(p["fits_one_device"][k] for k in ("generate", "extract", "train_drafter"))
    # the published Kimi-K2.5 EAGLE-3 drafter (TorchSpec configs/draft_models/kimi_k25_eagle3.json)
    d = p["drafter"]
    assert (d["hidden_size"], d["intermediate_size"], d["draft_vocab_size"]) == (7168, 12288, 32000)
    assert p["host_memory"]["node_train"] < 512 * 2**30  # 8 ranks of the drafter's run, not of the 1T target
