"""A full disk is one line that says so and where, and what was written before stays whole: simulated by
making the writers raise what they raise on ENOSPC (OSError 28, torch's zip writer's `unexpected pos`)."""

from __future__ import annotations

import errno
import hashlib
import shutil
from pathlib import Path

import pytest

from eaglewire.infra.atomic import atomic_dir, atomic_file, disk_full
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.cli import run_cli

FULL = r"disk full while writing .*nothing marked complete"


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _torch_full(obj, f, *a, **k):  # what torch.save says after a short write
    Path(f).write_bytes(b"PK" * 50)
    raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 300288 vs 300176")


def _safetensors_full(tensors, path, *a, **k):
    Path(path).write_bytes(b"\x08" * 64)
    raise Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space left\" })")


def _tree(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_full_disk_is_recognised_through_the_wrappers():
    assert disk_full(OSError(errno.ENOSPC, "x")) and disk_full(OSError(errno.EDQUOT, "x"))
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "x")
    assert disk_full(wrapped) and not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(ValueError("bad value"))


def test_atomic_dir_and_file_keep_the_old_version(tmp_path):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "a.txt").write_text("old")
    (tmp_path / "f.json").write_text("old")
    with pytest.raises(EaglewireError, match=rf"^{tmp_path}: {FULL}") as e, atomic_dir(tmp_path / "art") as tmp:
        (tmp / "a.txt").write_text("new")
        _enospc()
    assert "art/" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EaglewireError, match=r"f.json"), atomic_file(tmp_path / "f.json") as f:
        f.write("new")
        _enospc()
    assert (tmp_path / "art" / "a.txt").read_text() == (tmp_path / "f.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "f.json"]  # no temporaries left
    with pytest.raises(OSError, match="Permission"), atomic_dir(tmp_path / "art"):  # other errors pass unchanged
        raise OSError(errno.EACCES, "Permission denied")


@pytest.mark.parametrize("what", ["torch", "safetensors"])
def test_train_checkpoint_save_on_a_full_disk(tiny_dataset, tmp_path, monkeypatch, what):
    """A full disk at the second save: one line (was `unexpected pos 300288 vs 300176`), the first save kept
    byte for byte, no drafter marked done; with space again, --resume finishes."""
    from eaglewire.training import runstate
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train

    kw = dict(data=tiny_dataset, out=tmp_path / "run", device="cpu", batch_size=4, ttt_steps=1, max_len=64,
              save_every=2, val_fraction=0.1, max_steps=4)
    name, full = ("save", _torch_full) if what == "torch" else ("save_file", _safetensors_full)
    real, before = getattr(runstate.torch if what == "torch" else runstate, name), {}

    def second_fails(obj, f, *a, **k):  # the save at step 2 succeeds, the one at step 4 finds the disk full
        if (tmp_path / "run" / "state").exists():
            before.update(_tree(tmp_path / "run" / "state"))
            return full(obj, f)
        return real(obj, f, *a, **k)

    monkeypatch.setattr(runstate.torch if what == "torch" else runstate, name, second_fails)
    with pytest.raises(EaglewireError, match=rf"^{tmp_path / 'run'}: {FULL.replace('writing', 'writing state/')}"):
        run_train(TrainConfig(**kw))
    assert before and _tree(tmp_path / "run" / "state") == before and not (tmp_path / "run" / "drafter").exists()
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".state")]
    monkeypatch.undo()
    assert Path(run_train(TrainConfig(**kw, resume=True))["drafter"]).is_dir()


def test_data_vocab_on_a_full_disk_is_one_line_and_keeps_the_vocabulary(tiny_dataset, tmp_path, monkeypatch):
    from eaglewire.data import vocab

    ds = shutil.copytree(tiny_dataset, tmp_path / "ds")
    assert run_cli("data", "vocab", ds, "--vocab-size", 20).returncode == 0
    before = _tree(ds)
    monkeypatch.setattr(vocab, "save_file", _safetensors_full)
    r = run_cli("data", "vocab", ds, "--vocab-size", 30)
    assert r.returncode == 2 and r.stderr.strip().startswith(f"error: {ds}: disk full while writing vocab.safetensors")
    assert len(r.stderr.strip().splitlines()) == 1 and _tree(ds) == before
    monkeypatch.setattr(vocab, "save_file", _enospc)
    assert run_cli("data", "vocab", ds, "--vocab-size", 30).returncode == 2 and _tree(ds) == before
