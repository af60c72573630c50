"""llama-server's routes on a fake vLLM server (fake_vllm.FakeVllm), for `doctor live` against hostile servers:
a /props reply of any shape, size or speed, no /version, and a /completion (or vLLM's /v1/completions) that
trickles its answer a byte at a time.

    with FakeVllm(metrics=[...]) as srv:
        llama_like(srv, props=[1, 2])      # /props answers a JSON list
        doctor_live(srv.url, ...)
"""

from __future__ import annotations

import json
import time

from eaglewire_testing.fake_vllm import FakeVllm

PROPS = {"model_path": "/models/tiny-llama-f32.gguf", "default_generation_settings": {"n_ctx": 2048},
         "build_info": "b1-fake"}
_UNSET = object()


def llama_like(srv: FakeVllm, props=_UNSET, props_bytes: int = 0, props_stall_s: float = 0.0,
               trickle_s: float = 0.0, llama: bool = True) -> FakeVllm:
    """`props`: the /props reply (default: a llama-server's); `props_bytes` > 0: an endless-looking body of that
    many bytes instead; `props_stall_s`: /props answers nothing for that long; `trickle_s` > 0: completions are
    sent one byte per `trickle_s` seconds; `llama=False`: keep vLLM's routes (only the trickle changes)."""
    base = srv.httpd.RequestHandlerClass
    reply = PROPS if props is _UNSET else props

    class Handler(base):
        def do_GET(self):  # noqa: N802
            if llama and self.path == "/version":
                return self.send_error(404)
            if not llama or self.path != "/props":
                return super().do_GET()
            if props_stall_s:
                time.sleep(props_stall_s)
                return None
            if not props_bytes:
                return self._json(reply)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"pad": "')
            for _ in range(props_bytes >> 20):
                self.wfile.write(b"a" * (1 << 20))
            self.wfile.write(b'"}')
            return None

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ids = srv.token_ids
            obj = ({"tokens": ids, "timings": {"predicted_n": len(ids)}} if llama
                   else {"choices": [{"text": "", "token_ids": ids}]})
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(len(body)) if trickle_s else [None]:
                self.wfile.write(body if i is None else body[i:i + 1])
                self.wfile.flush()
                time.sleep(trickle_s)

    srv.httpd.RequestHandlerClass = Handler
    return srv
