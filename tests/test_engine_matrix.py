"""The README's engine table is the one the code computes, and its cells follow the options they read."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.engine_matrix import markdown, rows
from eaglewire.engines.sglang import launch_command
from eaglewire.saved.formats import FORMATS
from eaglewire_testing.readme_tables import assert_readme_block

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_readme_engine_table_is_generated():
    assert_readme_block("engines:matrix", markdown(), "engine_matrix.markdown()")


def test_cells_are_what_the_commands_take():
    by = {r["engine"].split(" ")[0]: r for r in rows()}
    assert set(by) == {"SGLang", "vLLM", "llama.cpp", "speculators", "eaglewire's"}
    for fmt in FORMATS[:3]:  # every engine format export writes has its row
        assert any(r["export"] == f"`--format {fmt}`" for r in rows())
    assert by["llama.cpp"]["export"] == "`--format gguf`"
    assert by["SGLang"]["serve"].startswith("--print-command only") and by["SGLang"]["cpu"] == "no (CUDA)"
    assert by["vLLM"]["serve"] == by["llama.cpp"]["serve"] == "started and checked here"
    assert by["speculators"]["serve"] == "no" and by["eaglewire's"]["doctor_config"].startswith("no")
    flags = launch_command("T", "D", 3)  # the shape the table says serve prints
    assert f"topk {flags[flags.index('--speculative-eagle-topk') + 1]}," in by["SGLang"]["drafts"]
