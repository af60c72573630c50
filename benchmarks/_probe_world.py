"""What `probe_hardening.py` runs against: tiny artifacts built on demand, a misbehaving
OpenAI-compatible server, and the real `eaglewire` CLI as a subprocess.

Artifacts are made the way the tests make them (``src/eaglewire_testing``), once per probe
run and only when a selected case needs them; each case works on its own copy.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CLI_ENV = {**{k: v for k, v in os.environ.items() if k != "EAGLEWIRE_DEBUG"},
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}

from eaglewire_testing.chat_faults import GOOD, json_faults, reply  # noqa: E402

# ---------------------------------------------------------------------------------------------- the CLI


@dataclass
class Res:
    """One finished (or killed) `eaglewire` process."""

    cmd: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


def _limit_memory(gib: float):
    def apply():
        b = int(gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
    return apply


def cli(args, cwd: Path, timeout: float, umask: int = -1, mem_gib: float | None = None) -> Res:
    """`python -m eaglewire.cli ARGS` with a wall-clock limit; on timeout its process group is killed."""
    cmd = [sys.executable, "-m", "eaglewire.cli", *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         cwd=cwd, env=CLI_ENV, umask=umask, start_new_session=True,
                         preexec_fn=_limit_memory(mem_gib) if mem_gib else None)
    try:
        out, err = p.communicate(timeout=timeout)
        return Res(cmd, p.returncode, out, err, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Res(cmd, None, out, err, time.monotonic() - t0, timed_out=True)


def interrupt(args, cwd: Path, when, grace: float = 30.0) -> tuple[Res, float | None]:
    """Start the CLI, send SIGINT once `when()` is true (or after 60 s); returns (result, seconds to exit)."""
    cmd = [sys.executable, "-m", "eaglewire.cli", *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         cwd=cwd, env=CLI_ENV, start_new_session=True)
    while not when() and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    time.sleep(0.5)
    t_int = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=grace)
        return Res(cmd, p.returncode, out, err, time.monotonic() - t0), time.monotonic() - t_int
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Res(cmd, None, out, err, time.monotonic() - t0, timed_out=True), None


# ---------------------------------------------------------------------------------------------- lost data


def snapshot(paths) -> dict[str, str]:
    """Path -> content hash (or 'dir' / 'link:target') of everything under `paths` but locks, links not followed."""
    snap = {}
    for root in map(Path, paths):
        if not os.path.lexists(root):
            continue
        items = [root] if not root.is_dir() or root.is_symlink() else [root, *sorted(root.rglob("*"))]
        for p in items:
            if p.name.endswith(".lock"):  # a lock file records its holder's PID: not data
                continue
            if p.is_symlink():
                snap[str(p)] = "link:" + os.readlink(p)
            elif p.is_dir():
                snap[str(p)] = "dir"
            else:
                snap[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return snap


def lost(before: dict, after: dict) -> list[str]:
    gone = [p for p in before if p not in after]
    changed = [p for p in before if p in after and after[p] != before[p]]
    return [f"gone {p}" for p in gone] + [f"changed {p}" for p in changed]


# ---------------------------------------------------------------------------------------------- fake server


def _send(h, body: bytes, length: int | None = None, status: int = 200):
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body) if length is None else length))
    h.end_headers()
    h.wfile.write(body)


def _trickle(h):
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    for b in json.dumps(reply({"role": "assistant", "content": "x" * 100})).encode():  # a byte every 0.5 s
        h.wfile.write(bytes([b]))
        h.wfile.flush()
        time.sleep(0.5)


def _slow_after(n: int):
    def fault(h, k):
        if k <= n:
            return _send(h, json.dumps(GOOD).encode())
        time.sleep(120)  # the client is interrupted long before
        _send(h, json.dumps(GOOD).encode())
    return fault


def _first_incomplete(h, k):
    body = json.dumps(GOOD).encode()
    _send(h, body[:20], length=len(body)) if k == 1 else _send(h, body)


FAULTS = {
    **json_faults(),
    "huge-answer": lambda h: _send(h, json.dumps(reply({"role": "assistant", "content": "x" * 20_000_000})).encode()),
    "incomplete": lambda h: _send(h, json.dumps(GOOD).encode()[:20], length=400),
    "bad-status-line": lambda h: (h.wfile.write(b"NOT-HTTP garbage\r\n\r\n"), h.wfile.flush()),
    "not-utf8": lambda h: _send(h, b'{"choices": [{"message": {"role": "assistant", "content": "caf\xe9"}}]}'),
    "trickle": _trickle,
    "good-then-slow": _slow_after(2),
    "first-incomplete": _first_incomplete,
}


class FakeServer:
    """An OpenAI-compatible server on 127.0.0.1 whose chat replies follow `mode` (a key of FAULTS)."""

    def __init__(self):
        fake = self
        self.mode, self.posts, self.lock = "good", 0, threading.Lock()
        self.states_path = ""

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  /v1/models, /version, /get_server_info
                _send(self, json.dumps({"data": [{"id": "m"}]}).encode())

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                with fake.lock:
                    fake.posts += 1
                    k = fake.posts
                if fake.mode == "states-path":  # a capture server's reply naming the file `states_path`
                    return _send(self, json.dumps({"choices": [{"text": "x"}],
                                                   "kv_transfer_params": {"hidden_states_path": fake.states_path}}).encode())
                fault = FAULTS[fake.mode]
                if not callable(fault):
                    return _send(self, json.dumps(fault).encode())
                return fault(self, k) if fake.mode in ("good-then-slow", "first-incomplete") else fault(self)

            def log_message(self, *a):
                pass

        class Quiet(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # the client hung up on a fault: expected
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def set(self, mode: str) -> str:
        self.mode, self.posts = mode, 0
        return self.url


# ---------------------------------------------------------------------------------------------- artifacts


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def prompts(path: Path, n: int) -> Path:
    return write(path, "".join(json.dumps({"prompt": f"Tell me about the sea ({i})."}) + "\n" for i in range(n)))


class World:
    """Tiny artifacts, each built on first use (in-process, as tests/conftest.py builds them)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self._server: FakeServer | None = None
        self._interrupted = None
        self._vllms: list = []

    @property
    def server(self) -> FakeServer:
        if self._server is None:
            self._server = FakeServer()
        return self._server

    def vllm(self, **kw):
        """A fake vLLM server for `doctor live` (eaglewire_testing/fake_vllm.py), closed with the world."""
        from eaglewire_testing.fake_vllm import FakeVllm

        self._vllms.append(FakeVllm(**kw))
        return self._vllms[-1]

    def case_dir(self, name: str) -> Path:
        d = self.tmp / "cases" / name
        d.mkdir(parents=True)
        return d

    def copy(self, src: Path, dst: Path) -> Path:
        shutil.copytree(src, dst, symlinks=True)
        return dst

    @cached_property
    def llama_ds(self) -> Path:
        """A complete tiny dataset (answers, fp32 features, vocab) on tiny:llama."""
        from eaglewire_testing.tinydata import build_tiny_dataset

        (self.tmp / "llama").mkdir()
        return build_tiny_dataset(self.tmp / "llama", n=8, max_new_tokens=8, vocab_size=100, store_dtype="fp32")

    @cached_property
    def llama_answers(self) -> Path:
        """Only what `data generate` leaves (responses.jsonl, generate.config.json), from tiny:llama."""
        d = self.tmp / "llama-answers"
        d.mkdir()
        for f in ("responses.jsonl", "generate.config.json"):
            shutil.copy2(self.llama_ds / f, d / f)
        return d

    @cached_property
    def qwen_answers(self) -> Path:
        """Answers of tiny:qwen3 (4 prompts, 8 new tokens, greedy), as test_resume_rules.py makes them."""
        from eaglewire.data.config import DataGenerateConfig
        from eaglewire.data.pipeline import run_generate

        p = prompts(self.tmp / "qwen-prompts.jsonl", 4)
        out = self.tmp / "qwen-answers"
        run_generate(DataGenerateConfig(out=out, target="tiny:qwen3", prompts=p, max_new_tokens=8, device="cpu"))
        return out

    @property
    def qwen_prompts(self) -> Path:
        return self.qwen_answers.parent / "qwen-prompts.jsonl"

    def sharded_killed(self, d: Path) -> Path:
        """qwen3 answers plus rank-00000/ of a 2-rank extract killed before rank 0 merged the manifests."""
        from eaglewire.data.config import ExtractSettings
        from eaglewire.data.extract import extract
        from eaglewire.data.jsonl import read_jsonl
        from eaglewire.data.sharded import rank_dir
        from eaglewire.targets.load import load_target
        from eaglewire.targets.points import eagle3_default

        data = self.copy(self.qwen_answers, d / "data")
        t = load_target("tiny:qwen3")
        rows = [r for r in read_jsonl(data / "responses.jsonl") if "messages" in r and r["index"] % 2 == 0]
        s = ExtractSettings(points=[p.name for p in eagle3_default(t.num_layers)], dtype="fp32", shard_samples=1)
        extract(t, rows, rank_dir(data, 0), s, {})
        return data

    @cached_property
    def drafter(self) -> Path:
        """A briefly trained tiny:llama drafter (its real provenance: target, fingerprint, points)."""
        from eaglewire.training.config import TrainConfig
        from eaglewire.training.loop import run_train

        return Path(run_train(TrainConfig(data=self.llama_ds, out=self.tmp / "run", device="cpu", max_steps=2,
                                          warmup_steps=1, save_every=1000))["drafter"])

    def killed_run(self, d: Path) -> Path:
        """A training run killed after its state was saved (drafter/ not yet written), to --resume."""
        from eaglewire.training.config import TrainConfig
        from eaglewire.training.loop import run_train

        run_train(TrainConfig(data=self.llama_ds, out=d / "run", device="cpu", max_steps=2, save_every=1))
        shutil.rmtree(d / "run" / "drafter")
        return d / "run"

    @cached_property
    def ckpt(self) -> Path:
        """A random eaglewire checkpoint for an 8-layer target known only by shape (support/export_helpers)."""
        from eaglewire_testing.export_helpers import make_ckpt

        return make_ckpt(self.tmp / "ck")[0]

    def export(self, fmt: str) -> Path:
        from eaglewire.export.config import ExportConfig
        from eaglewire.export.exporter import run_export

        out = self.tmp / f"export-{fmt}"
        if not out.exists():
            run_export(ExportConfig(ckpt=self.ckpt, format=fmt, out=out))
        return out

    @cached_property
    def imported_no_target(self) -> Path:
        """`import --target-layers 8` of the SGLang export: a checkpoint that records no target."""
        from eaglewire.export.config import ImportConfig
        from eaglewire.export.importer import run_import

        run_import(ImportConfig(src=self.export("sglang"), out=self.tmp / "imported", target_layers=8))
        return self.tmp / "imported"

    def target_config(self, arch: str) -> dict:
        from eaglewire.targets.load import load_target

        return json.loads((load_target(f"tiny:{arch}").path / "config.json").read_text())

    def close(self):
        for v in self._vllms:
            v.close()
        if self._server is not None:
            self._server.httpd.shutdown()
