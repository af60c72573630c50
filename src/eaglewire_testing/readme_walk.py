"""The README's serve -> doctor live sequence, run as written (relative paths, from the run's parent directory).

The README's commands are read from its code blocks, so a test that walks them fails when the text drifts
from what works: `serve` in the background until it says `ready`, then `doctor live` against it from the same
working directory, then Ctrl-C stops `serve` (and its server) cleanly.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
RUN = "runs/demo-quick/train"  # what the README's commands name
README_PORT = "8000"  # serve's default port, which the README's doctor live line talks to


def readme_command(command: str) -> list[str]:
    """`command` as argv, asserting the README holds it as a line of its own (its comment aside)."""
    for line in README.read_text().splitlines():
        if line.partition("  #")[0].strip() == command:
            return shlex.split(command)
    raise AssertionError(f"README.md has no line {command!r}: the walk runs what the README says")


def stage_run(run: Path, cwd: Path) -> Path:
    """A copy of a training run where the README expects it, under `cwd`."""
    dst = cwd / RUN
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("serve"))
    return dst


def _ported(argv: list[str], port: int) -> list[str]:
    return [a.replace(f":{README_PORT}", f":{port}") for a in argv]


def walk(serve: list[str], live: list[str], cwd: Path, port: int, serve_flags: list[str],
         startup_s: float = 900, live_s: float = 900) -> dict:
    """Run `serve` (README argv plus `serve_flags`, on `port`) until `ready`, then `live` as written (on `port`),
    then Ctrl-C: {"serve_out", "serve_err", "serve_rc", "live": CompletedProcess}."""
    ew = [sys.executable, "-m", "eaglewire.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*ew, *serve[1:], *serve_flags, "--port", str(port)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err, ready = [], [], threading.Event()

    def pump(stream, into, watch):
        for line in stream:
            into.append(line)
            if watch and line.startswith("ready: "):
                ready.set()

    threads = [threading.Thread(target=pump, args=(proc.stdout, out, True), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, False), daemon=True)]
    for t in threads:
        t.start()
    live_res = None
    try:
        t0 = time.monotonic()
        while not ready.wait(1.0):
            if proc.poll() is not None or time.monotonic() - t0 > startup_s:
                break
        if ready.is_set():
            live_res = subprocess.run([*ew, *_ported(live, port)[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                                      timeout=live_s)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for t in threads:
            t.join(timeout=10)
    return {"serve_out": "".join(out), "serve_err": "".join(err), "serve_rc": proc.returncode, "live": live_res}
