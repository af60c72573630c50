"""state/meta.json is typed: a damaged step is one line naming the field, never a resume from a made-up step."""

import json

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.training.runstate import read_meta


@pytest.mark.parametrize("raw, field", [({"step": "abc"}, "step"), ({"step": -1}, "step"), ({"step": True}, "step"),
                                        ({"step": 10**30}, "step"), ({}, "step"), ({"step": 3, "skipped": [1]}, "skipped")])
def test_a_damaged_meta_is_one_line(tmp_path, raw, field):
    p = tmp_path / "meta.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(EaglewireError, match=rf"^{p}: field {field} = ") as e:
        read_meta(p)
    assert "\n" not in str(e.value)


def test_a_whole_meta_reads_with_its_defaults(tmp_path):
    p = tmp_path / "meta.json"
    p.write_text(json.dumps({"step": 4, "other": "kept"}))
    assert read_meta(p) == {"step": 4, "skipped": 0, "other": "kept"}
    p.write_text("[1]")
    with pytest.raises(EaglewireError, match="expected a JSON object"):
        read_meta(p)
