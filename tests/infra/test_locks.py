"""One writer per artifact directory: a second writer is refused with the holder's PID; kill -9 frees the lock."""

from __future__ import annotations

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
    from eaglewire.data.options import DataGenerateConfig
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
