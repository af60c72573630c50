"""The README's family table is the one the code computes, and the computed cells are the engines' answers."""

from __future__ import annotations

from pathlib import Path

from eaglewire.targets.coverage import markdown, rows
from eaglewire_testing.readme_tables import assert_readme_block

ROOT = Path(__file__).resolve().parents[2]


def test_readme_family_table_is_generated():
    assert_readme_block("coverage:families", markdown(), "coverage.markdown()")


def test_cells_name_the_engines_refusals():
    """vLLM 0.32.0's Glm4Moe and Gemma-3 classes lack SupportsEagle3; SGLang 0.5.23 captures from both."""
    by = {r["target"]: r for r in rows()}
    assert by["tiny:glm4_moe"]["vllm"] == "no" and by["tiny:gemma3"]["vllm"] == "no"
    assert by["tiny:glm4_moe"]["sglang"] == "yes" and by["tiny:kimi_k25"]["vllm"] == "yes"
    assert by["tiny:kimi_k25"]["sglang_ids"] == "+1 only when the first id is 1"
