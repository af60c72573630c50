"""A server eaglewire starts never outlives it: SIGTERM runs the stop path, kill -9 takes the server along.

The server is a stand-in (a tiny HTTP server answering /health, which also starts a worker of its own, as vLLM
does) started through the same classes `serve` uses, by a parent process that holds it as `serve` does. Before
the fix only Ctrl-C stopped it: after SIGTERM or kill -9 of the parent it kept running on its port.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglewire.engines.vllm_server import free_port, port_free

pytestmark = pytest.mark.unit

STAND_IN = '''#!{python}
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({workers!r}, "w").write(str(worker.pid))
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
from eaglewire.engines.vllm_server import ServeSpec, VllmServer
kind, exe, port, log = sys.argv[1:5]
if kind == "llama.cpp":
    srv = LlamaServer(exe, LlamaSpec(Path("t.gguf"), None, port=int(port)), Path(log))
else:
    srv = VllmServer(exe, ServeSpec(target_dir=Path(log).parent, drafter_dir=None, port=int(port)), Path(log))
try:
    srv.start(timeout=60)
    print(srv.proc.pid, flush=True)
    srv.proc.wait()  # what serve does once ready
finally:
    srv.stop()
'''


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone_within(pids: list[int], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("engine", ["llama.cpp", "vllm"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_dies_with_its_parent(tmp_path, engine, sig):
    exe, workers = tmp_path / "server", tmp_path / "worker.pid"
    exe.write_text(STAND_IN.format(python=sys.executable, workers=str(workers)))
    exe.chmod(0o755)
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, engine, str(exe), str(port), str(tmp_path / "log")],
                              stdout=subprocess.PIPE, text=True)
    server = worker = None
    try:
        server = int(parent.stdout.readline() or 0)
        assert server and alive(server), f"the stand-in did not start (log: {(tmp_path / 'log').read_text()!r})"
        worker = int(workers.read_text())
        os.kill(parent.pid, sig)
        parent.wait(timeout=20)
        assert gone_within([server], 5), f"the server outlived its parent ({sig.name})"
        assert port_free("127.0.0.1", port), f"port {port} still taken after the parent's {sig.name}"
        if sig == signal.SIGTERM:  # the stop path ran: the server's whole process group is gone
            assert gone_within([worker], 5), "the server's worker outlived the stop"
    finally:
        parent.kill()
        for p in (server, worker):
            if p and alive(p):
                os.kill(p, signal.SIGKILL)
