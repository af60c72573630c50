"""Paths read from a dataset never lead out of it, and nothing is deleted that eaglewire did not write.

A manifest is input: a shard entry naming `../victim.txt`, an absolute path or a
symlink out of the dataset used to be read by `data info` ("verified") and
deleted by `data extract --resume` as a "bad shard". Files named like shards that
the manifest does not list, and a --prompts file inside --out, are the user's.
"""

from __future__ import annotations

import json
import shutil

import pytest

from eaglewire.data.config import DataBuildConfig, DataExtractConfig
from eaglewire.data.manifest import MANIFEST, Manifest
from eaglewire.data.pipeline import info, run_build, run_extract
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import inside


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from eaglewire_testing.tinydata import build_tiny_dataset

    return build_tiny_dataset(tmp_path_factory.mktemp("ds"), n=4, max_new_tokens=6, vocab_size=50)


def _copy(ds, tmp_path):
    return shutil.copytree(ds, tmp_path / "ds")


def _point_first_shard_at(d, name):
    raw = json.loads((d / MANIFEST).read_text())
    raw["shards"][0]["file"] = name
    (d / MANIFEST).write_text(json.dumps(raw))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_shard_outside_the_dataset_is_refused_and_never_deleted(ds, tmp_path, how):
    d = _copy(ds, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    if how == "symlink":
        (d / "shard-00000.safetensors").unlink()
        (d / "shard-00000.safetensors").symlink_to(victim)
    else:
        _point_first_shard_at(d, "../victim.txt" if how == "dotdot" else str(victim))
    for act in (lambda: info(d), lambda: run_extract(DataExtractConfig(data=d, resume=True, device="cpu"))):
        with pytest.raises(EaglewireError, match=r"manifest.json: shards\[0\]") as e:
            act()
        assert "shards[0].file" in str(e.value) and "\n" not in str(e.value)
    assert victim.read_text() == "the user's file"


def test_a_shard_entry_of_the_wrong_type_is_one_line(tmp_path, ds):
    d = _copy(ds, tmp_path)
    raw = json.loads((d / MANIFEST).read_text())
    raw["shards"][0]["bytes"] = "12"
    (d / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(EaglewireError, match=r"shards\[0\]\.bytes: expected int"):
        Manifest.load(d)


def test_inside_refuses_every_way_out(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "link").symlink_to(tmp_path)
    assert inside(tmp_path / "in", "a/b.safetensors", "w") == tmp_path / "in" / "a" / "b.safetensors"
    for rel in ("../x", "/etc/passwd", "a/../../x", "link/x", "", 5):
        with pytest.raises(EaglewireError, match="^w: "):
            inside(tmp_path / "in", rel, "w")


def test_an_unlisted_shard_file_is_refused_and_kept(ds, tmp_path):
    d = _copy(ds, tmp_path)
    foreign = d / "shard-00042.safetensors"
    foreign.write_bytes(b"someone else's shard")
    with pytest.raises(EaglewireError, match="shard-00042.safetensors, which manifest.json lists"):
        run_extract(DataExtractConfig(data=d, resume=True, device="cpu"))
    assert foreign.read_bytes() == b"someone else's shard"


def test_the_shard_being_written_when_killed_is_redone(ds, tmp_path):
    """The manifest names the shard it is writing first: exactly that unlisted file is ours to remove."""
    d = _copy(ds, tmp_path)
    man = Manifest.load(d)
    last = man.shards.pop()
    man.recount()
    man.complete, man.pending = False, last["file"]
    man.save(d)
    run_extract(DataExtractConfig(data=d, resume=True, device="cpu"))
    again = Manifest.load(d)
    assert again.complete and again.pending is None and again.num_samples == Manifest.load(ds).num_samples


def test_build_into_a_directory_with_a_foreign_shard_stops_before_generating(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-00000.safetensors").write_bytes(b"not ours")
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    with pytest.raises(EaglewireError, match="shard-00000.safetensors, which no manifest lists"):
        run_build(DataBuildConfig(out=out, target="tiny:llama", prompts=p, device="cpu", max_new_tokens=2))
    assert (out / "shard-00000.safetensors").read_bytes() == b"not ours"
    assert not (out / "responses.jsonl").exists()


@pytest.mark.parametrize("where", ["inside", "is-the-dir", "around"])
def test_build_into_the_prompts_is_refused_and_the_prompts_kept(tmp_path, where):
    out = tmp_path / "out"
    p = {"inside": out / "prompts.jsonl", "is-the-dir": out / "prompts.jsonl", "around": tmp_path / "p.jsonl"}[where]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('{"prompt": "hi"}\n{"prompt": "hi"}\n')
    prompts = {"inside": p, "is-the-dir": out, "around": tmp_path}[where]
    with pytest.raises(EaglewireError, match="--out .*: is, holds or lies inside the input --prompts"):
        run_build(DataBuildConfig(out=out, target="tiny:llama", prompts=prompts, device="cpu", max_new_tokens=2))
    assert p.read_text() == '{"prompt": "hi"}\n{"prompt": "hi"}\n'
