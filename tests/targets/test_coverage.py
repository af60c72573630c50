"""The README's family table is the one the code computes, and the computed cells are the engines' answers."""

from __future__ import annotations

import re
from pathlib import Path

from eaglewire.targets.coverage import markdown, rows

ROOT = Path(__file__).resolve().parents[2]


def test_readme_family_table_is_generated():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- coverage:families -->\n(.*?)<!-- /coverage:families -->", text, re.S)
    assert m, "README.md: the families table (<!-- coverage:families -->) is missing"
    assert m.group(1) == markdown(), "README.md's families table is stale: regenerate it from coverage.markdown()"


def test_cells_name_the_engines_refusals():
    """vLLM 0.32.0's Glm4Moe and Gemma-3 classes lack SupportsEagle3; SGLang 0.5.23 captures from both."""
    by = {r["target"]: r for r in rows()}
    assert by["tiny:glm4_moe"]["vllm"] == "no" and by["tiny:gemma3"]["vllm"] == "no"
    assert by["tiny:glm4_moe"]["sglang"] == "yes" and by["tiny:kimi_k25"]["vllm"] == "yes"
    assert by["tiny:kimi_k25"]["sglang_ids"] == "+1 only when the first id is 1"
