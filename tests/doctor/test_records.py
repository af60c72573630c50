"""The serve record names the export its server loaded: read typed, and only inside its own directory."""

import json

import pytest

from eaglewire.doctor.records import SERVE_RECORD, recorded_export
from eaglewire.infra.errors import EaglewireError


def _record(tmp_path, export) -> tuple:
    ckpt, serve = tmp_path / "run" / "drafter", tmp_path / "run" / "serve"
    (serve / "vllm").mkdir(parents=True)
    ckpt.mkdir()
    (serve / SERVE_RECORD).write_text(json.dumps({"export": export, "url": "http://127.0.0.1:8000"}))
    return ckpt, serve


def test_the_recorded_export_inside_the_serve_directory(tmp_path):
    assert recorded_export(tmp_path / "nothing" / "drafter") is None
    ckpt, serve = _record(tmp_path, str(tmp_path / "run" / "serve" / "vllm"))
    assert recorded_export(ckpt) == serve / "vllm"
    ckpt, serve = _record(tmp_path / "b", "vllm")  # relative: to the record's directory
    assert recorded_export(ckpt) == serve / "vllm"
    ckpt, serve = _record(tmp_path / "c", "/somewhere/it/was/before/serve/vllm")  # a moved run
    assert recorded_export(ckpt) == serve / "vllm"


@pytest.mark.parametrize("export, msg", [("../../outside", "outside"), ("/etc", "outside"), (None, "expected the path"),
                                         (12345, "expected the path"), ("", "expected the path")])
def test_a_record_leading_elsewhere_or_damaged_is_one_line(tmp_path, export, msg):
    ckpt, serve = _record(tmp_path, export)
    with pytest.raises(EaglewireError, match=rf"^{serve / SERVE_RECORD}: field export = .*{msg}") as e:
        recorded_export(ckpt)
    assert "\n" not in str(e.value)
    (serve / SERVE_RECORD).write_text("{")
    with pytest.raises(EaglewireError, match=rf"^{serve / SERVE_RECORD}: invalid JSON"):
        recorded_export(ckpt)
