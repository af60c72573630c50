"""A stand-in SGLang server for `doctor live`: SGLang 0.5.23's routes and reply fields (the names come from
`eaglewire.engines.sglang`, which a test checks against the pinned wheel's source), answering each /generate
from `decode(ids, max_new_tokens) -> (output_ids, accepted drafts per verify round)`.

    with FakeSglang(decode=rounds_of(SpecEngine(t, drafter, points), depth=3)) as srv:
        doctor_live(srv.url, ...)

`meta` edits each reply's meta_info (a hostile server); `info` replaces /server_info's reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from eaglewire.engines.sglang import GENERATE_ROUTE, META_FIELDS, SERVER_INFO_ROUTES
from eaglewire_testing.fake_vllm import LocalServer

DONE, VERIFY_CT, CORRECT, HIST = META_FIELDS
_UNSET = object()


def server_info(depth: int = 3, topk: int = 1, algorithm: str | None = "EAGLE3", model: str = "m") -> dict:
    """The part of /server_info `doctor live` reads, as SGLang 0.5.23 resolves it (the chain's draft tokens:
    depth + 1, the root included)."""
    return {"model_path": model, "speculative_algorithm": algorithm, "speculative_num_steps": depth,
            "speculative_eagle_topk": topk, "speculative_num_draft_tokens": depth + 1,
            "speculative_draft_model_path": "/drafter", "version": "0.5.23", "frontend": "python"}


def meta_info(out: list[int], rounds: list[int], depth: int) -> dict:
    """meta_info as SGLang's tokenizer manager writes it for a request whose rounds accepted `rounds[i]` drafts."""
    meta = {DONE: len(out), "cached_tokens": 0, "finish_reason": {"type": "length"}}
    if rounds:
        hist = [0] * (max(rounds) + 1)
        for k in rounds:
            hist[k] += 1
        correct = sum(rounds)
        meta.update({"spec_accept_rate": correct / (len(rounds) * depth), "spec_accept_length": len(out) / len(rounds),
                     CORRECT: correct, "spec_num_proposed_drafts": len(rounds) * depth, VERIFY_CT: len(rounds),
                     HIST: hist})
    return meta


def rounds_of(engine, depth: int) -> Callable[[list[int], int], tuple[list[int], list[int]]]:
    """A decode running eaglewire's engine (a chain of `depth`, greedy), as a correctly serving SGLang would."""
    from eaglewire.decoding.engine import SpecConfig

    def decode(ids: list[int], max_new_tokens: int) -> tuple[list[int], list[int]]:
        r = engine.generate(ids, SpecConfig(mode="chain", depth=depth, min_prob=0.0, gate="step",
                                            max_new_tokens=max_new_tokens))
        return r.token_ids, [s.accepted for s in r.metrics.steps if s.drafted]

    return decode


class FakeSglang(LocalServer):
    def __init__(self, decode=None, depth: int = 3, info=_UNSET, meta: Callable[[dict], dict] | None = None,
                 model: str = "m"):
        self.decode = decode or (lambda ids, n: ([1, 2, 3, 4], [2]))
        self.info = server_info(depth, model=model) if info is _UNSET else info
        self.depth, self.meta, self.model, self.generated = depth, meta, model, 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _json(self, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path in SERVER_INFO_ROUTES:
                    return self._json(fake.info)
                if self.path == "/v1/models":  # SGLang's OpenAI adapter: root is the served name too
                    return self._json({"object": "list", "data": [{"id": fake.model, "object": "model",
                                                                   "owned_by": "sglang", "root": fake.model}]})
                return self.send_error(404)  # SGLang 0.5.23 has no /version, /props or /metrics of vLLM's

            def do_POST(self):  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != GENERATE_ROUTE:
                    return self.send_error(404)
                out, rounds = fake.decode(req["input_ids"], req["sampling_params"]["max_new_tokens"])
                meta = meta_info(out, rounds, fake.depth)
                fake.generated += 1
                return self._json({"text": "", "output_ids": out, "meta_info": fake.meta(meta) if fake.meta else meta})

            def log_message(self, *a):
                pass

        self.serve(Handler)
