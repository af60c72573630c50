"""Issue 52: the demo fits its preset to the target in one place (demo/fit.py), and prints what it then runs."""

from __future__ import annotations

import pytest

from eaglewire.demo.config import PRESETS, DemoConfig
from eaglewire.demo.fit import TINY, fit_preset
from eaglewire.demo.run import run_demo
from eaglewire.targets.load import resolve_target_dir

pytestmark = pytest.mark.unit

QUICK = PRESETS["quick"]


def test_a_llama_target_named_by_its_directory_runs_the_preset_as_written():
    """Not a tiny builder's name and a Llama layer to warm-start from: nothing to change, nothing said."""
    assert fit_preset(QUICK, str(resolve_target_dir("tiny:llama"))) == (QUICK, [])


def test_kimi_shrinks_to_the_tiny_sizes_and_starts_from_the_head_saying_why():
    p, why = fit_preset(QUICK, "tiny:kimi_k25")
    # Kimi-K2.5's layer 60 (after layers.59.out, eagle3-deep's deepest point on 61 layers) is MLA over experts
    assert p == {**QUICK, **TINY, "init": "head"}
    assert len(why) == 2 and "topic_prompts 8" in why[0]
    assert why[1].startswith("--init head instead of the preset's --init target: the target's layer 60 has a "
                             "DeepseekV3Attention self_attn without q_proj")


def test_a_preset_already_smaller_than_the_tiny_sizes_keeps_its_own():
    p, _ = fit_preset({**QUICK, "topic_prompts": 2, "bench_tokens": 64}, "tiny:llama")
    assert p["topic_prompts"] == 2 and p["bench_tokens"] == TINY["bench_tokens"] and p["init"] == "target"


def test_the_printed_commands_are_the_fitted_ones(tmp_path, capsys):
    lines = run_demo(DemoConfig(target="tiny:kimi_k25", run_dir=tmp_path / "d", print_commands=True))["commands"]
    train = next(x for x in lines if x.startswith("eaglewire train "))
    assert "--init head" in train and "--max-len 64" in train and "--epochs" not in train  # 1: train's default
    assert "--topic-prompts 8 --max-new-tokens 8 " in lines[0]
    assert not (tmp_path / "d").exists()  # printing writes nothing
