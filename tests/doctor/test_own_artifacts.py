"""Our own checkpoint and exports, doctored the way a user runs `doctor config`: no WARN or FAIL row.

A WARN on something eaglewire itself wrote is one the user cannot act on (the training
config "unknown", ids "only under eagle_config"): these tests pin the causes, not the messages.
"""

from __future__ import annotations

import json
import shutil

import pytest
import typer

from eaglewire.doctor.cli import run_config
from eaglewire.doctor.config import DoctorEngineConfig
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.doctor.records import trained_model_config
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.saved.checkpoint import read_provenance
from eaglewire_testing.export_helpers import L, make_ckpt


def _cli_config(capsys, **kw) -> dict:
    """`eaglewire doctor config ... --json` in process: (exit code, report)."""
    with pytest.raises(typer.Exit) as e:
        run_config(DoctorEngineConfig(json=True, **kw))
    return e.value.exit_code, json.loads(capsys.readouterr().out)


def _not_ok(rep: dict) -> list[dict]:
    return [c for c in rep["checks"] if not c["ok"]]


def test_fresh_checkpoint_and_its_exports_doctor_clean(tiny_drafter, tmp_path, capsys):
    ckpt, _ = tiny_drafter
    ck = tmp_path / "ck"
    shutil.copytree(ckpt, ck)
    for target in ("tiny:llama", ""):  # with the serving target, and from the checkpoint's provenance alone
        code, rep = _cli_config(capsys, drafter_dir=ck, engine="sglang", target=target)
        assert code == 0 and _not_ok(rep) == [], rep
        assert any(c["name"] == "rope / norm" for c in rep["checks"])
    for fmt in ("sglang", "vllm", "speculators"):
        run_export(ExportConfig(ckpt=ck, format=fmt, out=tmp_path / fmt, verifier="tiny:llama"))
    shutil.rmtree(ck)  # an export is checked on its own record: the checkpoint may be moved or gone
    for fmt in ("sglang", "vllm", "speculators"):
        for target in ("tiny:llama", ""):
            code, rep = _cli_config(capsys, drafter_dir=tmp_path / fmt, engine=fmt, target=target)
            assert code == 0 and _not_ok(rep) == [], (fmt, target, rep)
            names = {c["name"] for c in rep["checks"]}
            assert {"rope / norm", "points"} <= names and ("chat template" in names) == bool(target)


@pytest.mark.parametrize("kw", [{"norm_before_residual": True}, {"norm_before_residual": True, "fc_norm": True},
                                {"norm_before_residual": False}])
def test_speculators_export_norm_placement_is_read_where_vllm_reads_it(tmp_path, kw):
    """vLLM takes a speculators config's norm_before_residual from the top level (absent = True), not
    from transformer_layer_config: our export of a norm_before_residual drafter must not FAIL."""
    ck, _ = make_ckpt(tmp_path / "ck", **kw)
    out = tmp_path / "spec"
    run_export(ExportConfig(ckpt=ck, format="speculators", out=out, verifier="tiny:llama"))
    trained = read_provenance(ck).point_names
    rep = doctor_config(out, "speculators", L, trained, None, None, trained_model_config(out))
    assert [c for c in rep.checks if not c.ok] == []
    cfg = json.loads((out / "config.json").read_text())
    del cfg["norm_before_residual"]  # absent: vLLM assumes True
    (out / "config.json").write_text(json.dumps(cfg))
    rep = doctor_config(out, "speculators", L, trained, None, None, trained_model_config(out))
    row = next(c for c in rep.checks if c.name == "rope / norm")
    assert row.ok == kw["norm_before_residual"]
    assert row.ok or "norm_before_residual is True (absent: the engine default), trained with False" in row.detail


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_doctor_config_without_engine_checks_the_engine_the_export_was_written_for(tmp_path, capsys, fmt):
    """No --engine: an sglang export is read as SGLang reads it (as vLLM, its ids are not where vLLM looks)."""
    ck, _ = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format=fmt, out=tmp_path / fmt))
    code, rep = _cli_config(capsys, drafter_dir=tmp_path / fmt, target_layers=L)
    assert code == 0 and _not_ok(rep) == [], rep
    assert code == _cli_config(capsys, drafter_dir=tmp_path / fmt, target_layers=L, engine=fmt)[0]


def test_export_records_the_training_config(tmp_path):
    """`doctor config EXPORT` without --trained-on still checks rope/eps/norm after the checkpoint is gone."""
    ck, m = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "v"))
    shutil.rmtree(ck)
    assert trained_model_config(tmp_path / "v") == m.config.to_dict()
