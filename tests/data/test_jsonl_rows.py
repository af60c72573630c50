"""responses.jsonl rows: an index that is no prompt position is named (10^30 overflowed int64 in extraction),
and a cut last line is an error where the file is read as finished (it was dropped without a word)."""

import json

import pytest

from eaglewire.data.jsonl import MAX_INDEX, read_jsonl, response_problem
from eaglewire.infra.errors import EaglewireError

ROW = {"index": 0, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.mark.parametrize("index", [10**30, -1, "3", None, True, 2.0])
def test_an_index_that_is_no_prompt_position_is_named(tmp_path, index):
    p = tmp_path / "responses.jsonl"
    p.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "index": index}) + "\n")
    with pytest.raises(EaglewireError, match=rf"^{p}:2: index is .*expected the prompt's position"):
        read_jsonl(p, check=response_problem)
    assert response_problem({**ROW, "index": MAX_INDEX}) is None


def test_a_cut_last_line_is_dropped_only_where_a_writer_may_have_been_killed(tmp_path):
    p = tmp_path / "responses.jsonl"
    whole = json.dumps(ROW) + "\n"
    p.write_text(whole + whole.replace('"index": 0', '"index": 1')[:30])
    assert [r["index"] for r in read_jsonl(p, check=response_problem)] == [0]  # resuming: asked again
    with pytest.raises(EaglewireError, match=rf"^{p}:2: invalid JSON .*the last line is cut"):
        read_jsonl(p, tolerate_partial_tail=False, check=response_problem)
