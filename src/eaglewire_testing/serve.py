"""Start a real `transformers serve` (OpenAI-compatible) on a local model directory, for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc, seconds: float) -> None:
    t0 = time.time()
    while time.time() - t0 < seconds:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise RuntimeError(f"transformers serve did not become healthy in {seconds:.0f} s")


@contextmanager
def transformers_server(model_dir: Path, log_path: Path, extra: list[str] = (), threads: int = 1,
                        startup_s: float = 180.0):
    """Yields the server's base URL; the server runs in fp32 on CPU and is stopped on exit."""
    exe = Path(sys.executable).with_name("transformers")
    if not exe.exists():
        raise RuntimeError("the `transformers` CLI is missing from the venv (transformers[serving] pins: pyproject dev)")
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(exe), "serve", str(model_dir), "--port", str(port), "--device", "cpu",
                                 "--dtype", "float32", *extra], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_health(url, proc, startup_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


# vLLM in the tests runs eager: no torch.compile warm-up, which is ~40 s of each ~65 s server start on
# this CPU (measured: 24 s eager). What the tests check (which layers a server captures or feeds the
# drafter, and what it accepts) is the model's wiring, not the compiler's. The tests that run vLLM as a
# user does, compiled, say so: the default target's capture, the DeepSeek startup failure, `serve`.
VLLM_TEST_ARGS = ["--enforce-eager"]
