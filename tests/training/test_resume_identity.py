"""`train --resume` trains on the dataset the run started on (src/eaglewire/training/identity.py): another
dataset at the same path (rebuilt from another target, with other points) or under the same relative path
from another directory is refused with the difference named; the same dataset moved, copied or spelled
otherwise resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eaglewire.data.config import DataExtractConfig, DataVocabConfig
from eaglewire.data.pipeline import run_extract, run_vocab
from eaglewire.infra.errors import EaglewireError
from eaglewire.training.config import TrainConfig
from eaglewire.training.identity import check_ranks_agree
from eaglewire.training.loop import run_train
from eaglewire_testing.tinydata import build_tiny_dataset

pytestmark = pytest.mark.unit

KW = dict(device="cpu", batch_size=4, ttt_steps=1, max_len=64, save_every=1, val_fraction=0.1)
ANSWERS = ("prompts.jsonl", "responses.jsonl", "generate.config.json")


@pytest.fixture(scope="module")
def qwen_ds(tmp_path_factory):
    """A dataset of tiny:qwen3 shaped as the llama fixture (same hidden size, draft vocab of 200): only the
    target differs, so its weights load into the llama run's state."""
    return build_tiny_dataset(tmp_path_factory.mktemp("qwen"), arch="qwen3", n=12, max_new_tokens=8, vocab_size=200)


@pytest.fixture(scope="module")
def deep_ds(tiny_dataset, tmp_path_factory):
    """The llama fixture's answers extracted again at the eagle3-deep points (layers 1, 3, 6 for 1, 3, 4)."""
    d = tmp_path_factory.mktemp("deep") / "ds"
    d.mkdir()
    for f in ANSWERS:
        shutil.copy(tiny_dataset / f, d / f)
    run_extract(DataExtractConfig(data=d, target="tiny:llama", store_dtype="fp32", device="cpu", points=["eagle3-deep"]))
    run_vocab(DataVocabConfig(data=d, vocab_size=200))
    return d


def _fewer_samples(src: Path, dst: Path) -> Path:
    """A copy of `src` without its last shard: same target, points and draft vocab, another manifest."""
    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    last = man["shards"].pop()
    (dst / last["file"]).unlink()
    for k in ("num_samples", "num_tokens", "num_loss_tokens"):
        man[k] -= last[k]
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def _killed(data, out, **kw):
    run_train(TrainConfig(data=data, out=out, max_steps=2, **{**KW, **kw}))
    shutil.rmtree(out / "drafter")  # as if killed after the last save
    return out


def _resume(data, out, **kw):
    return run_train(TrainConfig(data=data, out=out, max_steps=2, resume=True, **{**KW, **kw}))


def _files(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in (out / "train.config.json", out / "state" / "meta.json",
                                             out / "state" / "model.safetensors")}


def _refused(data, out, match, **kw) -> str:
    before = _files(out)
    with pytest.raises(EaglewireError, match=match) as e:
        _resume(data, out, **kw)
    msg = str(e.value)
    assert "\n" not in msg and "not the dataset the run" in msg, msg
    assert _files(out) == before and not (out / "drafter").exists()  # nothing written before the refusal
    return msg


def _rebuild(src: Path, at: Path) -> None:
    shutil.rmtree(at)
    shutil.copytree(src, at)


def test_a_dataset_rebuilt_from_another_target_at_the_same_path_is_refused(tiny_dataset, qwen_ds, tmp_path):
    data = shutil.copytree(tiny_dataset, tmp_path / "ds")
    out = _killed(data, tmp_path / "run")
    _rebuild(qwen_ds, data)
    msg = _refused(data, out, r"target fingerprint differs in .*model_type llama -> qwen3")
    assert "manifest sha" in msg


def test_a_dataset_rebuilt_with_other_points_is_refused(tiny_dataset, deep_ds, tmp_path):
    data = shutil.copytree(tiny_dataset, tmp_path / "ds")
    out = _killed(data, tmp_path / "run")
    _rebuild(deep_ds, data)
    msg = _refused(data, out, r"points \[layers.1.out, layers.3.out, layers.4.out\] -> "
                              r"\[layers.1.out, layers.3.out, layers.6.out\]")
    assert "target fingerprint" not in msg


def test_the_same_relative_path_from_another_directory_naming_another_dataset_is_refused(tiny_dataset, tmp_path,
                                                                                         monkeypatch):
    for side in ("a", "b"):
        (tmp_path / side / "w1" / "w2").mkdir(parents=True)
    shutil.copytree(tiny_dataset, tmp_path / "a" / "base")
    _fewer_samples(tiny_dataset, tmp_path / "b" / "base")
    monkeypatch.chdir(tmp_path / "a" / "w1" / "w2")
    out = _killed(Path("../../base"), tmp_path / "run")
    monkeypatch.chdir(tmp_path / "b" / "w1" / "w2")
    msg = _refused(Path("../../base"), out, r"manifest sha \w+ -> \w+")
    assert str(tmp_path / "a" / "base") in msg  # where the run started: an absolute path, for the reader


def test_the_same_dataset_spelled_moved_or_copied_otherwise_resumes(tiny_dataset, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(tiny_dataset, tmp_path / "a" / "base")
    monkeypatch.chdir(tmp_path / "a")
    runs = [_killed(Path("base"), tmp_path / f"run{i}") for i in range(3)]
    rec = json.loads((runs[0] / "train.config.json").read_text()).get("dataset")
    monkeypatch.chdir(tmp_path / "elsewhere")  # the recorded relative "base" names nothing here
    assert Path(_resume(Path("../a/base"), runs[0])["drafter"]).is_dir()
    copy = shutil.copytree(tmp_path / "a" / "base", tmp_path / "copy")
    assert Path(_resume(copy, runs[1])["drafter"]).is_dir()
    moved = shutil.move(tmp_path / "a" / "base", tmp_path / "moved")
    assert Path(_resume(Path(moved), runs[2])["drafter"]).is_dir()
    # recorded by content, with the absolute path for the reader
    assert rec["path"] == str(tmp_path / "a" / "base") and rec["manifest_sha"] and rec["points"]


def test_another_draft_vocabulary_is_refused(tiny_dataset, tmp_path):
    data = shutil.copytree(tiny_dataset, tmp_path / "ds")
    out = _killed(data, tmp_path / "run")
    run_vocab(DataVocabConfig(data=data, vocab_size=150))
    _refused(data, out, r"draft vocabulary 200 ids, sha \w+ -> 150 ids")


def test_online_answers_changed_at_the_same_path_are_refused(tiny_dataset, tmp_path):
    data = tmp_path / "answers"
    data.mkdir()
    for f in ANSWERS:
        shutil.copy(tiny_dataset / f, data / f)
    online = dict(online=True, target="tiny:llama", store_dtype="fp32", vocab_size=200)
    out = _killed(data, tmp_path / "run", **online)
    moved = shutil.move(data, tmp_path / "moved")
    assert Path(_resume(Path(moved), out, **online)["drafter"]).is_dir()  # moved: the same answers
    shutil.rmtree(out / "drafter")
    lines = (moved / "responses.jsonl").read_text().splitlines(keepends=True)
    (moved / "responses.jsonl").write_text("".join(lines[:-1]))
    _refused(moved, out, r"responses.jsonl sha \w+ -> \w+", **online)


def test_a_damaged_identity_record_is_one_line(tiny_dataset, tmp_path):
    out = _killed(tiny_dataset, tmp_path / "run")
    p = out / "train.config.json"
    raw = json.loads(p.read_text())
    for bad in ([1], {**raw["dataset"], "points": "x"}, {**raw["dataset"], "manifest_sha": None}):
        p.write_text(json.dumps({**raw, "dataset": bad}))
        with pytest.raises(EaglewireError, match=r"train.config.json: field dataset"):
            _resume(tiny_dataset, out)


def test_ranks_reading_different_datasets_are_refused():
    a = {"path": "/x", "target": {"model_type": "llama", "config_sha": "1"}, "points": ["layers.1.out"],
         "vocab": {"size": 2, "sha": "s"}, "manifest_sha": "m1"}
    check_ranks_agree([a, dict(a, path="/y")], Path("ds"))  # the same dataset elsewhere on another node
    with pytest.raises(EaglewireError, match=r"rank 1 reads another dataset than rank 0 .*manifest sha m1 -> m2"):
        check_ranks_agree([a, dict(a, manifest_sha="m2")], Path("ds"))
