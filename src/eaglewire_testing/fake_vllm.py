"""A fake vLLM server for `doctor live`: what it lists, its version, its counters and completions are set
by the test (or the hardening probe), so a hostile or restarted server can be played without vLLM.

    with FakeVllm(metrics=[counters(0, [0, 0]), counters(10, [6, 3])]) as srv:
        doctor_live(srv.url, ...)

Each GET /metrics answers the next text of `metrics` (the last one repeats); `trickle_s` > 0 sends
/metrics one byte at a time, that many seconds apart.
"""

from __future__ import annotations

import http.server
import json
import threading
import time


def counters(drafts: float, per_pos: list, model: str = "m") -> str:
    """vLLM's Prometheus lines for `drafts` rounds that accepted `per_pos[p]` drafts at position p."""
    lab = f'engine="0",model_name="{model}"'
    return "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {drafts * len(per_pos)}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {sum(per_pos)}",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {a}' for p, a in enumerate(per_pos)),
    ]) + "\n"


def models(*ids: str, root: str | None = None) -> dict:
    return {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "vllm", "root": root or i} for i in ids]}


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # the client hung up (a deadline): expected
        pass


class LocalServer:
    """A stand-in server on a free loopback port, in a daemon thread: `serve(Handler)`, then `url`."""

    def serve(self, handler) -> None:
        self.httpd = _Quiet(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FakeVllm(LocalServer):
    def __init__(self, served=None, version=None, metrics=None, token_ids=None, trickle_s: float = 0.0):
        self.served = models("m") if served is None else served  # the /v1/models reply
        self.version = {"version": "0.32.0"} if version is None else version  # the /version reply
        self.metrics = list(metrics or [counters(0, [0, 0])])
        self.token_ids = [1, 2, 3] if token_ids is None else token_ids
        self.trickle_s, self.gets = trickle_s, 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _json(self, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/v1/models":
                    return self._json(fake.served)
                if self.path == "/version":
                    return self._json(fake.version)
                if self.path != "/metrics":
                    return self.send_error(404)
                text = fake.metrics[min(fake.gets, len(fake.metrics) - 1)].encode()
                fake.gets += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                for i in range(0, len(text), 1 if fake.trickle_s else len(text) or 1):
                    self.wfile.write(text[i:i + (1 if fake.trickle_s else len(text))])
                    self.wfile.flush()
                    time.sleep(fake.trickle_s)

            def do_POST(self):  # noqa: N802  /v1/completions
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._json({"choices": [{"text": "", "token_ids": fake.token_ids}]})

            def log_message(self, *a):
                pass

        self.serve(Handler)
