"""Targets by hub id (`org/name`): found in a local HF cache laid out as the hub lays it out, never fetched."""

import json
import socket
import time

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.load import load_target, resolve_target_dir
from eaglewire_testing.cli import run_cli
from eaglewire_testing.hubcache import COMMIT, cache_repo

REPO = "acme/tiny-llama"


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connect fails and is recorded: a lookup must not even try."""
    tries = []

    def refuse(self, *a, **k):
        tries.append(a)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return tries


@pytest.fixture
def hub(tmp_path, monkeypatch, no_network):
    """(cache, snapshot dir, the model directory it was made from) with HF_HUB_CACHE pointing at the cache."""
    from eaglewire.targets.tiny import build_tiny

    src = build_tiny("llama", tmp_path / "src")
    cache = tmp_path / "hub"
    snap = cache_repo(cache, REPO, src)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # no local ./acme: the id can only mean the cached repo
    return cache, snap, src


def test_hub_id_resolves_to_the_cached_snapshot(hub, no_network):
    cache, snap, _ = hub
    d = resolve_target_dir(REPO)
    assert d == cache / "models--acme--tiny-llama" / "snapshots" / COMMIT == snap
    assert (d / "config.json").is_symlink() and not no_network


def test_fingerprint_equals_the_same_model_loaded_by_path(hub):
    _, snap, src = hub
    t = load_target(REPO)
    assert (t.source, t.path) == (REPO, snap)
    by_path = TargetFingerprint.of(load_target(str(src)))
    assert TargetFingerprint.of(t) == by_path and TargetFingerprint.of(t).mismatch(by_path) == []


def test_dataset_provenance_records_the_id_and_the_snapshot(hub, tmp_path):
    from eaglewire.data.config import DataExtractConfig, DataGenerateConfig
    from eaglewire.data.pipeline import run_extract, run_generate

    _, snap, src = hub
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Tell me about the sea."}\n{"prompt": "Explain why the sky is blue."}\n')
    out = tmp_path / "ds"
    run_generate(DataGenerateConfig(out=out, target=REPO, prompts=prompts, max_new_tokens=4, device="cpu"))
    run_extract(DataExtractConfig(data=out, target=REPO, device="cpu"))
    rec = json.loads((out / "manifest.json").read_text())["target"]
    assert rec["source"] == REPO and rec["path"] == str(snap)
    assert rec["fingerprint"] == TargetFingerprint.of(load_target(str(src))).to_json()


def test_a_local_directory_wins_over_the_same_hub_id(hub, tmp_path):
    _, snap, src = hub
    assert resolve_target_dir(REPO) == snap
    (tmp_path / "acme").mkdir()
    src.rename(tmp_path / REPO)  # ./acme/tiny-llama now exists: the name is that local directory
    assert resolve_target_dir(REPO) == tmp_path.joinpath(REPO).relative_to(tmp_path)


def test_not_cached_is_one_line_naming_the_id_the_cache_and_the_fix(tmp_path, monkeypatch, no_network):
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(EaglewireError) as e:
        resolve_target_dir("meta-llama/Llama-3.1-8B-Instruct")
    msg = str(e.value)
    assert time.perf_counter() - t0 < 5 and not no_network
    assert "\n" not in msg and msg.startswith("target 'meta-llama/Llama-3.1-8B-Instruct': ")
    assert f"not in the local Hugging Face cache at {cache}" in msg
    assert "`hf download meta-llama/Llama-3.1-8B-Instruct`" in msg and "HF_HUB_CACHE" in msg
    r = run_cli("inspect", "--target", "meta-llama/Llama-3.1-8B-Instruct")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: target 'meta-llama/")


def test_a_mistyped_local_model_path_names_the_close_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "model").mkdir(parents=True)
    with pytest.raises(EaglewireError, match=r"no local path runs/modl \(did you mean runs/model\?\)"):
        resolve_target_dir("runs/modl")
