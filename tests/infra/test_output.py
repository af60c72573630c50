"""`--json` prints one indented JSON document (non-JSON values as strings); otherwise the human printer runs."""

import json
from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import check_ranges
from eaglewire.infra.output import emit, json_flag, to_json


def test_emit_json_or_human(capsys):
    res = {"out": Path("/a/b"), "n": 2}
    emit(res, True, lambda r: print("human"))
    out = capsys.readouterr().out
    assert json.loads(out) == {"out": "/a/b", "n": 2} and out == to_json(res) + "\n"
    emit(res, False, lambda r: print(f"n={r['n']}"))
    assert capsys.readouterr().out == "n=2\n"


def test_json_flag_is_an_off_by_default_option():
    @dataclass
    class Cfg:
        json: bool = json_flag("print the summary as JSON")

    f = Cfg.__dataclass_fields__["json"]
    assert Cfg().json is False and f.metadata["help"] == "print the summary as JSON"
    check_ranges(Cfg(json=True))
