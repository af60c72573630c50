"""`train --resume` compares directories, not the strings that named them: a run started with relative paths
resumes when given absolute ones, and a moved run resumes where it is now."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train

KW = dict(device="cpu", batch_size=4, ttt_steps=1, max_len=64, save_every=1, val_fraction=0.1)


def _killed(data, out, steps=2):
    run_train(TrainConfig(data=data, out=out, max_steps=steps, **KW))
    shutil.rmtree(out / "drafter")  # as if killed after the last save
    return out


def test_relative_then_absolute_and_a_moved_run_resume(tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    link = tmp_path / "ds-link"
    link.symlink_to(tiny_dataset)
    _killed(Path(os.path.relpath(tiny_dataset, tmp_path)), Path("run"))
    assert json.loads((tmp_path / "run" / "train.config.json").read_text())["config"]["out"] == "run"
    shutil.move(tmp_path / "run", tmp_path / "moved")
    r = run_train(TrainConfig(data=link, out=tmp_path / "moved", max_steps=2, resume=True, **KW))
    assert Path(r["drafter"]).is_dir()


def test_a_run_recorded_before_the_dataset_identity_compares_data_as_a_directory(tiny_dataset, tmp_path):
    """Without the `dataset` record (older runs) another directory is refused, as before; with it, the
    dataset is compared by content (test_resume_identity.py)."""
    out = _killed(tiny_dataset, tmp_path / "run")
    p = out / "train.config.json"
    raw = json.loads(p.read_text())
    p.write_text(json.dumps({k: v for k, v in raw.items() if k != "dataset"}))
    other = shutil.copytree(tiny_dataset, tmp_path / "other")
    with pytest.raises(EaglewireError, match=r"changed config \(data: .* -> .*other'\)"):
        run_train(TrainConfig(data=other, out=out, max_steps=2, resume=True, **KW))


@pytest.mark.parametrize("content", ["[1, 2]", '{"config": [1]}', '{"conf'])
def test_a_malformed_train_config_is_one_line(tiny_dataset, tmp_path, content):
    out = _killed(tiny_dataset, tmp_path / "run")
    (out / "train.config.json").write_text(content)
    with pytest.raises(EaglewireError, match="train.config.json: "):
        run_train(TrainConfig(data=tiny_dataset, out=out, max_steps=2, resume=True, **KW))
