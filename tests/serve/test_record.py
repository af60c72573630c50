"""serve.json names its files relative to its own directory, and `doctor live` predicts with the gate it records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from eaglewire.doctor import commands, live
from eaglewire.doctor.config import DoctorLiveConfig
from eaglewire.doctor.records import SERVE_RECORD, recorded_export
from eaglewire.serve.record import write_record
from eaglewire_testing.fake_llama import llama_like
from eaglewire_testing.fake_vllm import FakeVllm, counters

pytestmark = pytest.mark.unit


def test_a_record_written_from_a_relative_out_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("runs/demo-quick/train/serve")
    (out / "llama.cpp").mkdir(parents=True)
    write_record(out, {"export": str(out / "llama.cpp"), "log": str(out / "llama-server.log"),
                       "target_gguf": "/cache/t-f32.gguf", "p_min": 0.5})
    rec = json.loads((out / SERVE_RECORD).read_text())
    assert (rec["export"], rec["log"], rec["target_gguf"]) == ("llama.cpp", "llama-server.log", "/cache/t-f32.gguf")
    for cwd, ckpt in ((tmp_path, "runs/demo-quick/train/drafter"), (tmp_path / "runs", "demo-quick/train/drafter")):
        monkeypatch.chdir(cwd)
        assert recorded_export(Path(ckpt)).resolve() == tmp_path / out / "llama.cpp"


class _Stub:
    """eaglewire's engine as predicted_acceptance drives it: records the gate each prediction drafts with."""

    def __init__(self):
        self.gates = []

    def generate(self, ids, cfg):
        self.gates.append(cfg.min_prob)
        return SimpleNamespace(token_ids=[1], metrics=SimpleNamespace(steps=[SimpleNamespace(drafted=1, accepted=1)]))


METRICS = [counters(0, [0]), counters(2, [2])]


@pytest.mark.parametrize("llama", [True, False])
def test_a_recorded_gate_applies_to_llama_server_only(llama):
    engine = _Stub()
    with FakeVllm(metrics=[m.replace("vllm:", "llamacpp:") for m in METRICS] if llama else METRICS) as srv:
        llama_like(srv, llama=llama)
        rep = live.doctor_live(srv.url, engine, [[1, 2], [3]], 1, p_min=0.5, say=lambda m: None,
                               gate_from="runs/x/serve/serve.json")
    assert engine.gates == ([0.5] * 2 if llama else [0.0] * 2)
    assert rep.data["p_min"] == (0.5 if llama else 0.0)
    assert ("as runs/x/serve/serve.json records" in rep.checks[0].detail) is llama


def test_doctor_live_inherits_the_gate_serve_recorded(tiny_drafter, tmp_path, monkeypatch):
    """Before: the README's `doctor live` after `serve --engine llama.cpp` predicted ungated, against a server gated
    at 0.5, and FAILed positions 0 and 2; --p-min still overrides the record."""
    ckpt, _ = tiny_drafter
    run = tmp_path / "run"
    shutil.copytree(ckpt, run / "drafter")
    (run / "serve" / "llama.cpp").mkdir(parents=True)
    write_record(run / "serve", {"export": str(run / "serve" / "llama.cpp"), "p_min": 0.5})
    seen = []
    monkeypatch.setattr(commands, "doctor_live", lambda *a, **k: seen.append(k) or "report")
    base = {"server": "http://127.0.0.1:1", "drafter": run, "num_prompts": 1, "json": True}
    assert commands.live_report(DoctorLiveConfig(**base)) == "report"
    assert seen[-1]["p_min"] == 0.5 and seen[-1]["gate_from"] == str(run / "serve" / SERVE_RECORD)
    commands.live_report(DoctorLiveConfig(**base, p_min=0.0))
    assert seen[-1]["p_min"] == 0.0 and not seen[-1]["gate_from"]
