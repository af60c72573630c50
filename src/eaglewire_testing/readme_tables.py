"""The README's generated tables: each sits between `<!-- name -->` and `<!-- /name -->` markers and must
equal what its module computes (the tests regenerate, compare and say which module to run)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def assert_readme_block(marker: str, generated: str, source: str) -> None:
    m = re.search(rf"<!-- {re.escape(marker)} -->\n(.*?)<!-- /{re.escape(marker)} -->", README.read_text(), re.S)
    assert m, f"README.md: the generated table (<!-- {marker} -->) is missing"
    assert m.group(1) == generated, f"README.md's {marker} table is stale: regenerate it from {source}"
