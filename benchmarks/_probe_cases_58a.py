"""Issue 58 (first part) and one item of 55: directories handed to outside code, servers that outlive `serve`,
a killed export's temporary directory, GGUF weights beyond f16.

- a target whose configs name code (`HybridDNATokenizer`, `auto_map`) never reaches llama.cpp's converter
  or vLLM: `export --format gguf --verifier`, `serve --engine llama.cpp --target`, `serve --engine vllm
  --target`, each with `y` on stdin; the marker file must never appear;
- a server started the way `serve` starts one dies with its parent (kill -9);
- a killed export's hidden temporary directory is removed by the next export beside it;
- a drafter whose weights exceed f16 is refused at `--gguf-type f16`, naming the tensor and a type that holds it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _probe_cases import Case, need
from _probe_cases_36 import _answer_yes
from _probe_world import Res, World, write


def _not(path: str, what: str):
    return lambda res, w, d: need(not (d / path).exists(), what)


def _evil_target(w: World, d: Path, tok: dict, cfg: dict) -> Path:
    """tiny:llama with configs naming `evil_tok.py`, which writes d/RAN when imported."""
    from eaglewire.targets.load import resolve_target_dir

    t = w.copy(resolve_target_dir("tiny:llama"), d / "evil")
    write(t / "evil_tok.py", f"open({str(d / 'RAN')!r}, 'w').write('x')\n"
                             "from transformers import PreTrainedTokenizerFast\n"
                             "class HybridDNATokenizer(PreTrainedTokenizerFast):\n    pass\nCfg = HybridDNATokenizer\n")
    for name, extra in (("tokenizer_config.json", tok), ("config.json", cfg)):
        raw = json.loads((t / name).read_text())
        write(t / name, json.dumps({**raw, **extra}))
    return t


HYBRID = ({"tokenizer_class": "HybridDNATokenizer", "auto_map": {"AutoTokenizer": ["evil_tok.HybridDNATokenizer", None]}},
          {})
ASKS = ({}, {"model_type": "evil_llama", "auto_map": {"AutoConfig": "evil_tok.Cfg"}})
CLASS_ONLY = ({"tokenizer_class": "HybridDNATokenizer"}, {})


def _export_gguf(variant):
    def prep(w: World, d: Path) -> list:
        t = _evil_target(w, d, *variant)
        return ["export", w.copy(w.drafter, d / "drafter"), "--format", "gguf", "--verifier", t, "--out", d / "out"]
    return prep


def _serve(engine: str, variant):
    def prep(w: World, d: Path) -> list:
        t = _evil_target(w, d, *variant)
        fake = write(d / "llama-server", "#!/bin/sh\nexit 1\n")
        fake.chmod(0o755)
        extra = ["--llama-server", fake] if engine == "llama.cpp" else ["--vllm-python", sys.executable]
        return ["serve", w.copy(w.drafter, d / "drafter"), "--engine", engine, "--target", t, "--check-prompts", 0,
                "--out", d / "serve", *extra]
    return prep


def _code_case(name: str, prep, words=("auto_map", "never runs model code")) -> Case:
    return Case(name, 1, prep, run=_answer_yes, words=words, timeout=300, strict=False,
                post=lambda res, w, d: (_not("RAN", "the directory's code RAN")(res, w, d),
                                        _not("out", "an export was written")(res, w, d),
                                        _not("serve", "serve wrote its directory")(res, w, d)))


STAND_IN = '''#!{python}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

PARENT = '''
import sys
from pathlib import Path
from eaglewire.engines.llama_server import LlamaServer, LlamaSpec
srv = LlamaServer(sys.argv[1], LlamaSpec(Path("t.gguf"), None, port=int(sys.argv[2])), Path(sys.argv[3]))
srv.start(timeout=60)
print(srv.proc.pid, flush=True)
srv.proc.wait()
'''


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill9_parent(w: World, d: Path, args: list) -> Res:
    """A llama-server stand-in started as `serve` starts it; its parent killed with -9; is the server gone?"""
    from eaglewire.engines.vllm_server import free_port

    exe = write(d / "server", STAND_IN.format(python=sys.executable))
    exe.chmod(0o755)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", PARENT, str(exe), str(free_port()), str(d / "log")],
                         stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline() or 0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    end = time.monotonic() + 5
    while pid and _alive(pid) and time.monotonic() < end:
        time.sleep(0.1)
    left = bool(pid) and _alive(pid)
    if left:
        os.kill(pid, signal.SIGKILL)
    return Res(["kill -9 <parent of a llama-server>"], 0 if pid and not left else 1, "", "server outlived its parent"
               if left else "", time.monotonic() - t0)


def _server_gone(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, res.stderr or "the stand-in server did not start")
    return "the server died with its parent"


def _stale_tmp(w: World, d: Path) -> list:
    stale = d / ".out.ab12cd34"  # what a killed export (atomic_dir's temporary) left
    write(stale / "eaglewire-drafter" / "model.safetensors", b"x" * 1_000_000)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    return ["export", w.copy(w.drafter, d / "drafter"), "--format", "vllm", "--out", d / "out"]


def _stale_removed(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
    need(not (d / ".out.ab12cd34").exists(), "the killed export's temporary directory is still there")
    return "the next export removed the killed one's temporary directory"


def _f16_overflow(w: World, d: Path) -> list:
    from safetensors.torch import load_file, save_file

    ck = w.copy(w.drafter, d / "drafter")
    f = next(ck.glob("*.safetensors"))
    sd = load_file(str(f))
    key = next(k for k in sd if "down_proj" in k)
    sd[key] = sd[key] * 0 + 7e4
    save_file(sd, str(f), metadata={"format": "pt"})
    return ["export", ck, "--format", "gguf", "--verifier", "tiny:llama", "--out", d / "out"]


def issue58a() -> list[Case]:
    return [
        _code_case("i58-export-gguf-verifier-hybriddna", _export_gguf(HYBRID)),
        _code_case("i58-export-gguf-verifier-asks-on-stdin", _export_gguf(ASKS)),
        _code_case("i58-export-gguf-verifier-unknown-tokenizer-class", _export_gguf(CLASS_ONLY),
                   words=("HybridDNATokenizer", "never runs model code")),
        _code_case("i58-serve-llamacpp-target-code", _serve("llama.cpp", HYBRID)),
        _code_case("i58-serve-vllm-target-code", _serve("vllm", ASKS)),
        Case("i58-server-dies-with-serve-kill9", 2, lambda w, d: [], run=_kill9_parent, check=_server_gone, timeout=60),
        Case("i58-killed-export-temp-dir-removed", 3, _stale_tmp, check=_stale_removed),
        Case("i58-gguf-f16-overflow", 4, _f16_overflow, words=("cannot be exported as f16", "--gguf-type"),
             post=_not("out", "a GGUF was written"), timeout=180),
    ]


if __name__ == "__main__":  # list the cases (the lead wires them into probe_hardening.py)
    for c in issue58a():
        print(c.name)
