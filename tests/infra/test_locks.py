"""One writer per artifact directory: a second writer is refused with the holder's PID; kill -9 frees the lock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import LOCK_NAME, dir_lock

HOLD = "import sys, time; from eaglewire.infra.locks import dir_lock\nwith dir_lock(sys.argv[1], 'test'):\n print('held', flush=True); time.sleep(60)"


def _holder(d):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_writer_is_refused_with_the_holders_pid_and_kill_frees_it(tmp_path):
    p = _holder(tmp_path / "ds")
    try:
        with pytest.raises(EaglewireError, match=rf"another eaglewire process \(PID {p.pid}\)"):
            with dir_lock(tmp_path / "ds", "data build"):
                pass
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    with dir_lock(tmp_path / "ds", "data build"):  # the kernel released it with the process
        assert (tmp_path / "ds" / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_reentrant_in_one_process(tmp_path):
    with dir_lock(tmp_path, "outer"):
        with dir_lock(tmp_path, "inner"):
            pass
        with dir_lock(tmp_path, "again"):
            pass


def test_data_commands_take_the_lock(tmp_path):
    from eaglewire.data.config import DataGenerateConfig
    from eaglewire.data.pipeline import run_generate

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    p = _holder(tmp_path / "ds")
    try:
        with pytest.raises(EaglewireError, match=rf"PID {p.pid}"):
            run_generate(DataGenerateConfig(out=tmp_path / "ds", target="tiny:llama", prompts=prompts, device="cpu"))
        assert not (tmp_path / "ds" / "responses.jsonl").exists()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


@pytest.mark.parametrize("fail", [False, True])
def test_the_lock_file_and_the_dirs_this_run_made_and_left_empty_go(tmp_path, fail):
    d = tmp_path / "a" / "b"
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
        with dir_lock(d, "test"):
            assert (d / LOCK_NAME).is_file()
            if fail:
                raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_what_was_there_or_was_written_stays(tmp_path):
    (tmp_path / "old").mkdir()
    with dir_lock(tmp_path / "old", "test"):
        pass
    with pytest.raises(RuntimeError):
        with dir_lock(tmp_path / "new" / "ds", "test"):
            (tmp_path / "new" / "ds" / "responses.jsonl").write_text('{"index": 0}\n')
            raise RuntimeError("boom")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "new", "new/ds", "new/ds/responses.jsonl", "old"]


def test_a_lock_file_its_holder_removed_meanwhile_is_not_taken(tmp_path, monkeypatch):
    """The holder removes the file as it lets go; whoever opened it just before must lock the new file, not the
    removed one (a third writer creating a new file would otherwise hold "the" lock too)."""
    import fcntl

    from eaglewire.infra.locks import _acquire

    path, real, calls = tmp_path / LOCK_NAME, fcntl.flock, []

    def flock(fd, op):
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:  # the holder lets go between our open and our flock
            path.unlink()
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    fd = _acquire(path, tmp_path, "test")
    try:
        assert len(calls) == 2 and os.fstat(fd).st_ino == os.stat(path).st_ino
    finally:
        os.close(fd)
