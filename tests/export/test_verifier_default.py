"""speculators exports name their verifier: from --verifier, else from the target the checkpoint records."""

from __future__ import annotations

import dataclasses
import json

import pytest

from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.targets.load import resolve_target_dir
from eaglewire_testing.export_helpers import make_ckpt


def _with_source(ck, source):
    m, prov = load_checkpoint(ck)
    save_checkpoint(ck, m, dataclasses.replace(prov, target=dataclasses.replace(prov.target, source=source)))


def _verifier(out):
    return json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]


def test_no_recorded_target_and_no_flag_fails_with_the_fix(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck")
    with pytest.raises(EaglewireError, match="records none: pass --verifier"):
        run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s"))
    assert not (tmp_path / "s").exists()


def test_recorded_local_target_becomes_its_directory(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck")
    _with_source(ck, "tiny:llama")
    run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s"))
    v = _verifier(tmp_path / "s")
    assert v["name_or_path"] == str(resolve_target_dir("tiny:llama").resolve())
    assert v["architectures"] == ["LlamaForCausalLM"]  # read from that directory's config.json


def test_recorded_hub_id_stays_an_id_and_the_flag_wins(tmp_path, monkeypatch):
    from eaglewire_testing.hubcache import cache_repo

    ck, _ = make_ckpt(tmp_path / "ck")
    _with_source(ck, "meta-llama/Llama-3.1-8B-Instruct")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(EaglewireError, match="neither a directory here nor in the local HF cache.*pass --verifier"):
        run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s"))  # could be a relative path
    cache_repo(tmp_path / "hub", "meta-llama/Llama-3.1-8B-Instruct", resolve_target_dir("tiny:llama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s"))
    v = _verifier(tmp_path / "s")
    assert v == {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]}
    run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "t", verifier="my/verifier"))
    assert _verifier(tmp_path / "t")["name_or_path"] == "my/verifier"


def test_recorded_target_missing_here_fails_naming_it(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck")
    _with_source(ck, str(tmp_path / "gone-model"))
    with pytest.raises(EaglewireError, match="gone-model.*cannot be found here.*pass --verifier"):
        run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s"))
