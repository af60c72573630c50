"""`plan --model-config` on a config nested a hundred thousand levels deep: one line naming the file (it was a
RecursionError traceback from Python's recursive JSON decoder)."""

from __future__ import annotations

import pytest

from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit


def test_a_deeply_nested_model_config_is_one_line(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = run_cli("plan", "--model-config", cfg)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"error: --model-config {cfg}: JSON nested too deep to read (expected an HF config.json)"
