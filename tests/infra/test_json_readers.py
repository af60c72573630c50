"""Every JSON file we read from disk: bad bytes, bad JSON or nesting too deep is one line naming the file.

Found by the mutation probe (benchmarks/_probe_mutations.py): 10,000 nested lists made
`json.loads` raise RecursionError, which no reader caught, and three readers caught nothing.
"""

import json

import pytest

from eaglewire.infra.errors import EaglewireError

DEEP = "[" * 10_000 + "]" * 10_000
BAD = {"deep": DEEP.encode(), "not-utf8": b'{"a": "\xff\xfe"}', "cut": b'{"a": [1, 2', "empty": b""}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_read_json_config_and_jsonl(tmp_path, kind):
    from eaglewire.data.jsonl import read_jsonl
    from eaglewire.infra.atomic import read_json
    from eaglewire.saved.formats import read_config_json

    f = tmp_path / "config.json"
    f.write_bytes(BAD[kind])
    for call in (lambda: read_json(f, "missing"), lambda: read_config_json(tmp_path)):
        with pytest.raises(EaglewireError, match="config.json"):
            call()
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"a": 1}\n' + BAD[kind] + b"\n")
    if kind != "empty":  # an empty line is skipped, as blank lines are
        with pytest.raises(EaglewireError, match="rows.jsonl"):
            read_jsonl(rows)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_checkpoint_config_export_record_and_generate_record(tmp_path, kind):
    from eaglewire.data.pipeline import _generate_settings
    from eaglewire.doctor.records import trained_wiring
    from eaglewire.saved.checkpoint import load_checkpoint

    (tmp_path / "config.json").write_bytes(BAD[kind])
    with pytest.raises(EaglewireError, match="config.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "eaglewire.export.json").write_bytes(BAD[kind])
    with pytest.raises(EaglewireError, match="eaglewire.export.json"):
        trained_wiring(tmp_path)
    (tmp_path / "generate.config.json").write_bytes(BAD[kind])
    with pytest.raises(EaglewireError, match="generate.config.json"):
        _generate_settings(tmp_path / "generate.config.json")


_PTS = ["layers.1.out", "layers.3.out", "layers.4.out"]


@pytest.mark.parametrize("record, says", [({"points": "a", "target_fingerprint": None}, "points"),
                                          ({"target_num_layers": 8, "target_fingerprint": None}, "points"),  # absent
                                          ({"points": _PTS, "target_num_layers": "8", "target_fingerprint": None},
                                           "target_num_layers"),
                                          ({"points": _PTS, "target_fingerprint": None}, "target_num_layers"),
                                          ({"points": _PTS, "target_num_layers": 10**30, "target_fingerprint": None},
                                           "target_num_layers")])
def test_export_record_fields_are_typed(tmp_path, record, says):
    from eaglewire.doctor.records import trained_wiring

    (tmp_path / "eaglewire.export.json").write_text(json.dumps(record))
    with pytest.raises(EaglewireError, match=says):
        trained_wiring(tmp_path)


def test_generate_record_without_settings_is_no_settings(tmp_path):
    from eaglewire.data.pipeline import _generate_settings

    (tmp_path / "g.json").write_text(json.dumps({"config": {}}))
    assert _generate_settings(tmp_path / "g.json") == {}
    (tmp_path / "g.json").write_text(json.dumps({"result": []}))
    with pytest.raises(EaglewireError, match="result.settings"):
        _generate_settings(tmp_path / "g.json")
