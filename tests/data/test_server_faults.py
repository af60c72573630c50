"""`data generate --server` against a fake OpenAI server that misbehaves: each fault becomes a per-request
failure with its reason in failures.jsonl (never a traceback, never a stored answer); valid variants are kept."""

import http.server
import json
import threading
import time

import pytest

from eaglewire_testing import chat_faults
from eaglewire_testing.cli import run_cli

GOOD, _reply = chat_faults.GOOD, chat_faults.reply


class _Fake(http.server.BaseHTTPRequestHandler):
    mode = "good"

    def do_GET(self):  # noqa: N802  /v1/models and /version
        self._send(json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        fault = FAULTS[type(self).mode]
        if callable(fault):
            return fault(self)
        self._send(json.dumps(fault).encode())

    def _send(self, body: bytes, length: int | None = None):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length if length is not None else len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _incomplete(h):
    h._send(json.dumps(GOOD).encode()[:20], length=400)  # the connection closes 380 bytes early


def _not_utf8(h):
    h._send(b'{"choices": "\xff\xfe"}')


def _trickle(h):
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    for b in json.dumps(GOOD).encode()[:12]:  # one byte every 0.3 s: each read is quick, the whole is not
        h.wfile.write(bytes([b]))
        h.wfile.flush()
        time.sleep(0.3)


def _slow(h):
    time.sleep(30)
    h._send(json.dumps(GOOD).encode())


FAULTS = {
    **chat_faults.json_faults(),
    "slow": _slow,
    "huge-answer": _reply({"role": "assistant", "content": "x" * 2_000_000}),
    "incomplete": _incomplete,
    "not-utf8": _not_utf8,
    "trickle": _trickle,
    "token-ids": _reply(token_ids=[17, 18, 2]),  # vLLM's return_token_ids: the ids it generated
    "token-ids-reasoning": _reply({"role": "assistant", "content": "Blue.", "reasoning_content": "hm"}, token_ids=[4, 5]),
}
EXPECT = {
    "token-ids-mistyped": "choices[0].token_ids",
    "int-content": "not text", "message-string": "not an object", "usage-list": "usage is list",
    "no-content-key": "without message.content", "huge-count": "answer tokens for a max_tokens 8",
    "huge-answer": "characters for a max_tokens 8", "incomplete": "IncompleteRead", "not-utf8": "not JSON",
    "trickle": "no complete reply within --request-timeout 1",
}


@pytest.fixture(scope="module")
def fake():
    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # the client hung up on a fault: expected
            pass

    httpd = Quiet(("127.0.0.1", 0), _Fake)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _generate(fake, tmp_path, mode):
    _Fake.mode = mode
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What colour is the sky?"}) + "\n")
    return run_cli("data", "generate", "--target", "tiny:llama", "--prompts", prompts, "--max-new-tokens", 8,
                   "--out", tmp_path / "d", "--server", fake, "--retries", 1, "--request-timeout", 1)


@pytest.mark.parametrize("mode", sorted(EXPECT))
def test_each_fault_is_a_listed_failure_not_a_traceback_or_an_answer(fake, tmp_path, mode):
    r = _generate(fake, tmp_path, mode)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "1 of 1 requests failed" in r.stderr, r.stderr
    failures = [json.loads(x) for x in (tmp_path / "d" / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == 1 and EXPECT[mode] in failures[0]["error"], failures
    answers = tmp_path / "d" / "responses.jsonl"
    assert not answers.exists() or answers.read_text() == ""


@pytest.mark.parametrize("mode", ["good", "parts"])
def test_valid_replies_are_stored(fake, tmp_path, mode):
    r = _generate(fake, tmp_path, mode)
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "d" / "responses.jsonl").read_text().splitlines()[0])
    assert row["messages"][-1]["content"] == "Blue."


@pytest.mark.parametrize("mode, ids", [("good", None), ("token-ids", [17, 18, 2]), ("token-ids-reasoning", None)])
def test_server_token_ids_are_stored_when_they_match_the_stored_turn(fake, tmp_path, mode, ids):
    """The server's own ids when it gives them; its text (tokenised at extract) when not, or when reasoning was split off."""
    r = _generate(fake, tmp_path, mode)
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "d" / "responses.jsonl").read_text().splitlines()[0])
    assert row.get("answer_ids") == ids
    gen = json.loads((tmp_path / "d" / "generate.config.json").read_text())["result"]["settings"]
    assert gen["answer_ids"] == {"from_server": int(ids is not None), "retokenized_text": int(ids is None)}


def test_a_server_without_scheme_is_one_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = run_cli("data", "generate", "--target", "tiny:llama", "--prompts", prompts, "--out", tmp_path / "d",
                "--server", "localhost:8000")
    assert r.returncode == 2 and "expected a URL such as http://" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_stops_within_seconds_and_keeps_what_was_written(fake, tmp_path):
    """With 30 s server replies and 4 retries, the worker threads used to hold the process for minutes."""
    import os
    import signal
    import subprocess
    import sys

    port = fake.rsplit(":", 1)[1]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    _Fake.mode = "slow"
    p = subprocess.Popen([sys.executable, "-m", "eaglewire.cli", "data", "generate", "--target", "tiny:llama",
                          "--prompts", str(prompts), "--out", str(tmp_path / "d"), "--server", f"http://127.0.0.1:{port}",
                          "--concurrency", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    time.sleep(8)  # past startup, requests in flight
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 10 and p.returncode == 130, err[-500:]
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err


def test_token_ids_are_asked_of_vllm_only():
    """`transformers serve` refuses unknown fields (every request failed with return_token_ids): ask vLLM only."""
    from eaglewire.data.config import GenSettings
    from eaglewire.data.server import _body, is_vllm

    assert is_vllm({"version": {"version": "0.32.0"}})
    assert not is_vllm({"version": {"version": "0.5.23"}, "get_server_info": {}})  # SGLang
    assert not is_vllm({"server_header": "uvicorn"}) and not is_vllm({"version": {"data": []}})
    s = GenSettings()
    assert _body("m", [], s, 0, token_ids=True)["return_token_ids"] is True
    assert "return_token_ids" not in _body("m", [], s, 0)
