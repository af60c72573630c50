"""The serve record names the export its server loaded: read typed, and only inside its own directory."""

import json
from pathlib import Path

import pytest

from eaglewire.doctor.records import SERVE_RECORD, recorded_export, recorded_gate
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


def test_an_older_record_naming_the_export_from_serves_working_directory_is_read(tmp_path, monkeypatch):
    """Before: `serve` ran in the run's parent recorded runs/demo-quick/train/serve/llama.cpp, which was joined onto
    the record's directory again (runs/.../serve/runs/.../serve/llama.cpp: 'expected a drafter .gguf file')."""
    run = tmp_path / "runs" / "demo-quick" / "train"
    (run / "serve" / "llama.cpp").mkdir(parents=True)
    (run / "drafter").mkdir()
    (run / "serve" / SERVE_RECORD).write_text(json.dumps({"export": "runs/demo-quick/train/serve/llama.cpp"}))
    monkeypatch.chdir(tmp_path)
    assert recorded_export(Path("runs/demo-quick/train/drafter")).resolve() == run / "serve" / "llama.cpp"
    monkeypatch.chdir(run)  # the same record read from elsewhere: the directory of that name beside the record
    assert recorded_export(Path("drafter")).resolve() == run / "serve" / "llama.cpp"


def test_the_recorded_gate_is_read_typed(tmp_path):
    ckpt, serve = _record(tmp_path, "vllm")
    assert recorded_gate(ckpt) == (None, None)  # vLLM's record: no gate
    (serve / SERVE_RECORD).write_text(json.dumps({"export": "llama.cpp", "p_min": 0.5}))
    assert recorded_gate(ckpt) == (0.5, serve / SERVE_RECORD)
    for bad in ("0.5", 1.5, True, -0.1):
        (serve / SERVE_RECORD).write_text(json.dumps({"export": "llama.cpp", "p_min": bad}))
        with pytest.raises(EaglewireError, match=rf"^{serve / SERVE_RECORD}: field p_min = .*expected llama.cpp's "):
            recorded_gate(ckpt)
