"""Prompt files nested far deeper than any record (`[[[[...` a hundred thousand levels) are one line naming the
file, in each of the shapes the reader detects: Python's JSON decoder recurses per level and raised
RecursionError through every command that reads --prompts."""

from __future__ import annotations

import pytest

from eaglewire.data.prompt_files import load_prompts
from eaglewire.infra.errors import EaglewireError

pytestmark = pytest.mark.unit
DEPTH = 100_000


@pytest.mark.parametrize("name, text, where", [
    ("a.jsonl", '{"prompt": "hi"}\n' + "[" * DEPTH + "]" * DEPTH + "\n", "a.jsonl:2"),  # a JSONL line
    ("b.json", "[" * DEPTH + "]" * DEPTH, "b.json"),  # one JSON array (ShareGPT dumps)
    ("c.json", '{"a":' * DEPTH + "1" + "}" * DEPTH, "c.json"),  # one pretty-printed record
    ("d.jsonl", '{"messages": ' + "[" * DEPTH + "]" * DEPTH + "}\n", "d.jsonl:1"),
])
def test_deeply_nested_prompt_files_are_one_line(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    with pytest.raises(EaglewireError, match=rf"{where}: JSON nested too deep") as e:
        load_prompts(tmp_path / name)
    assert "\n" not in str(e.value)
