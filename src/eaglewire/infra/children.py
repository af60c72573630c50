"""Child processes that never outlive eaglewire, never read its stdin and never run a model's code.

Why each rule:
- A server (vLLM, llama-server) started by `serve`, `demo` or a managed
  extract holds a port and a loaded model. Only Ctrl-C used to run the stop
  path: SIGTERM (systemd, `kill`, a CI timeout) or `kill -9` left it running,
  and the next run met "port already in use". The child gets its own process
  group (so the stop path takes its workers too) and a parent-death signal
  (Linux `PR_SET_PDEATHSIG`): the kernel sends it SIGTERM the moment its
  parent dies, however it dies. SIGTERM to eaglewire itself becomes an exit
  that runs every `finally`, so the group is stopped as on Ctrl-C.
- stdin is closed: transformers asks "Do you wish to run the custom code?
  [y/N]" on stdin, and a child that inherited ours would read the user's (or a
  pipe's) "y" behind a prompt it never showed. Closed, the question fails.
- The environment is offline: a class reference like `org/repo--module.Class`
  would otherwise download code from the hub.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}


# looked up here, not in the forked child: dlopen after fork in a threaded process can deadlock
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: the kernel sends it SIGTERM when its parent dies."""
    if _PRCTL is not None:
        parent = os.getppid()
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will send the signal
            os.kill(os.getpid(), signal.SIGTERM)


def _exit_on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends us at once (children still get theirs)
    raise SystemExit(128 + signum)


_OWNED: set[int] = set()  # children started while our SIGTERM handler is installed


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def sigterm_runs_cleanup(pid: int) -> None:
    """While child `pid` runs, SIGTERM raises SystemExit, so the `finally` that stops it runs (Python's default
    kills at once). Only from the main thread, and only over the default action: a caller's own handler is kept."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _exit_on_sigterm):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        _OWNED.add(pid)


def _release(pid: int) -> None:
    """The default SIGTERM again once no child of ours runs (a long-lived caller, a test runner, is not changed)."""
    _OWNED.discard(pid)
    if not _OWNED and _main_thread() and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def child_env(extra: dict[str, str] | None = None, offline: bool = True) -> dict[str, str]:
    """Our environment for a child, offline unless `offline` is False (then only where the user did not say)."""
    env = dict(os.environ)
    if offline:
        env.update(OFFLINE)
    else:
        for k, v in OFFLINE.items():
            env.setdefault(k, v)
    env.update(extra or {})
    return env


def start_child(cmd: Sequence[str], log: Path | None = None, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> subprocess.Popen:
    """A long-lived child (a server): its own process group, SIGTERM when we die, stdin closed, output to `log`.

    The parent-death signal follows the thread that forks: call from the thread that lives as long as the
    child should (the main thread, for every server eaglewire starts)."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115  closed below, the child keeps its copy
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
                                env=env if env is not None else child_env(), cwd=cwd, start_new_session=True,
                                preexec_fn=_die_with_parent)
    finally:
        if log is not None:
            out.close()
    sigterm_runs_cleanup(proc.pid)
    return proc


def run_child(cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A short child whose output we read (a converter): as `start_child`, waited for; killed with its group
    on timeout, Ctrl-C or SIGTERM."""
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env if env is not None else child_env(), cwd=cwd,
                            start_new_session=True, preexec_fn=_die_with_parent)
    sigterm_runs_cleanup(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    _release(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM to the child's process group, SIGKILL after `grace` seconds; nothing when it already ended."""
    try:
        _stop(proc, grace)
    finally:
        _release(proc.pid)


def _stop(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
