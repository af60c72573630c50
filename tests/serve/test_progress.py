"""Long waits say so on stderr (a vLLM start takes minutes on a CPU), nothing under --json; Ctrl-C on `serve`,
its normal way to stop, says that it stopped and not to rerun with a --resume `serve` does not have."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eaglewire.doctor.commands import _say
from eaglewire.doctor.live import Acceptance, doctor_live
from eaglewire.engines import vllm_server
from eaglewire.engines.vllm_server import ServeSpec, VllmServer, free_port
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.fake_vllm import FakeVllm, counters

pytestmark = pytest.mark.unit


def test_a_server_start_says_how_long_it_has_waited_and_what_the_log_says(tmp_path, monkeypatch):
    """Before: `serve` was silent for the 5-7 minutes a CPU server takes to start."""
    monkeypatch.setattr(vllm_server.time, "sleep", lambda s: None)
    monkeypatch.setattr(vllm_server, "PROGRESS_EVERY_S", 0.02)
    log = tmp_path / "vllm.log"
    log.write_text("INFO loading weights\nINFO compiling graphs\n")
    srv = VllmServer("py", ServeSpec(target_dir=tmp_path, drafter_dir=None, port=free_port()), log)
    srv.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    said = []
    try:
        with pytest.raises(EaglewireError, match="not healthy after 0 s"):
            srv._wait_healthy(0.2, said.append)
    finally:
        srv.stop()
    assert len(said) >= 2 and all(s.startswith("[serve] waiting for the vLLM server at ") for s in said)
    assert "--startup-timeout" in said[0] and said[-1].endswith(": INFO compiling graphs")


@pytest.mark.parametrize("quiet", [True, False])
def test_doctor_live_progress_is_quiet_under_json(quiet, capsys):
    with FakeVllm(metrics=[counters(0, [0]), counters(4, [2])]) as srv:
        doctor_live(srv.url, None, [[1, 2]], 4, offline=lambda d: Acceptance(4, [2]), say=_say(quiet))
    err = capsys.readouterr().err
    assert ("[live]" in err) is not quiet


def test_ctrl_c_on_serve_says_it_stopped_not_to_resume(tmp_path):
    """Before: 'interrupted: ... rerun the command with --resume', and exit 130, for the normal end of serving."""
    script = tmp_path / "serve_ctrl_c.py"
    script.write_text(
        "import os, signal, sys\n"
        "from eaglewire import cli\n"
        "from eaglewire.serve import serving\n"
        "def held(cfg):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while serving\n"
        "        signal.pause()\n"
        "    except KeyboardInterrupt:\n"
        "        print('stopped: vLLM server (Ctrl-C)', file=sys.stderr)\n"
        "        return {}\n"
        "serving.run_serve = held\n"
        "sys.argv = ['eaglewire', 'serve', 'run']\n"
        "cli.main()\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "stopped: vLLM server" in r.stderr, r.stderr[-2000:]
    assert "--resume" not in r.stderr and "interrupted" not in r.stderr
