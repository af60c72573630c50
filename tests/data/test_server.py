"""`data generate/build --server` against a real `transformers serve` on a tiny target.

The reference is our in-process generation: greedy answers through the
server must equal ours token for token (same weights, fp32). Retries and
failure reporting are exercised by a fault-injecting proxy in front of the
real server (it fails chosen requests, then forwards).
"""

import http.server
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eaglewire.targets.load import resolve_target_dir
from eaglewire_testing.cli import run_cli
from eaglewire_testing.serve import free_port, transformers_server

pytestmark = pytest.mark.integration  # a real `transformers serve`

N_PROMPTS, NEW_TOKENS = 6, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        with transformers_server(resolve_target_dir("tiny:llama"), tmp_path_factory.mktemp("serve") / "serve.log") as url:
            yield url
    except RuntimeError as e:  # a missing server is a failure, never a skip
        pytest.fail(str(e))


def _prompts(tmp_path) -> Path:
    p = tmp_path / "prompts.jsonl"
    texts = ["Name three rivers.", "What is two plus two?", "Write a haiku about snow.",
             "Explain gravity briefly.", "Say hello in French.", "List two colours."]
    p.write_text("\n".join(json.dumps({"prompt": t}) for t in texts[:N_PROMPTS]) + "\n")
    return p


_run = run_cli


def _answers(d: Path) -> dict:
    return {r["index"]: r["messages"] for r in map(json.loads, (d / "responses.jsonl").read_text().splitlines())}


def test_server_answers_equal_local_and_build_records_provenance(server, tmp_path):
    prompts = _prompts(tmp_path)
    common = ["--target", "tiny:llama", "--prompts", prompts, "--max-new-tokens", NEW_TOKENS]
    local = _run("data", "generate", *common, "--out", tmp_path / "local", "--device", "cpu", "--gen-batch-size", 1)
    assert local.returncode == 0, local.stderr
    r = _run("data", "build", *common, "--out", tmp_path / "srv", "--device", "cpu", "--server", server + "/v1",
             "--concurrency", 3, "--json")
    assert r.returncode == 0, r.stderr
    assert _answers(tmp_path / "srv") == _answers(tmp_path / "local")
    assert len(_answers(tmp_path / "srv")) == N_PROMPTS
    man = json.loads((tmp_path / "srv" / "manifest.json").read_text())
    gen = man["generation"]
    assert man["complete"] and man["num_samples"] == N_PROMPTS
    assert gen["source"] == "server" and gen["server"]["model"] == str(resolve_target_dir("tiny:llama"))
    assert gen["chat_template"]["prompt_tokens_checked"] == N_PROMPTS
    assert gen["chat_template"]["prompt_tokens_mismatched"] == 0
    assert gen["reasoning"]["mode"] == "keep" and gen["temperature"] == 0.0


def test_resume_asks_only_for_missing_answers(server, tmp_path):
    prompts = _prompts(tmp_path)
    args = ["data", "generate", "--target", "tiny:llama", "--prompts", prompts, "--max-new-tokens", NEW_TOKENS,
            "--out", tmp_path / "d", "--server", server, "--json"]
    assert _run(*args).returncode == 0
    path = tmp_path / "d" / "responses.jsonl"
    full = _answers(tmp_path / "d")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:25])  # two rows lost, one of them half-written
    r = _run(*args, "--resume")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["resumed"] == N_PROMPTS - 2 and res["responses"] == 2
    assert _answers(tmp_path / "d") == full
    assert len(path.read_text().splitlines()) == N_PROMPTS  # no duplicates


class _FaultProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the real server; fails the first `transient` chat requests with 503 and
    every chat request whose prompt contains `poison` with 400 (not retryable)."""

    upstream, transient, poison, chat_calls = "", 0, "", 0
    lock = threading.Lock()

    def _forward(self, body: bytes | None):
        req = urllib.request.Request(self.upstream + self.path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                code, data = r.status, r.read()
        except urllib.error.HTTPError as e:  # e.g. /version on a server without it: relay the 404
            code, data = e.code, e.read()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._forward(None)

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        with cls.lock:
            cls.chat_calls += 1
            fail_transient = cls.chat_calls <= cls.transient
        if fail_transient or cls.poison in body.decode():
            self.send_response(503 if fail_transient else 400)
            self.end_headers()
            self.wfile.write(b'{"error": "injected"}')
            return
        self._forward(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def proxy(server):
    _FaultProxy.upstream, _FaultProxy.transient, _FaultProxy.poison, _FaultProxy.chat_calls = server, 3, "haiku", 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FaultProxy)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_retries_transient_errors_and_reports_failed_samples(proxy, tmp_path):
    prompts = _prompts(tmp_path)
    args = ["data", "generate", "--target", "tiny:llama", "--prompts", prompts, "--max-new-tokens", NEW_TOKENS,
            "--out", tmp_path / "d", "--server", proxy, "--concurrency", 2, "--retries", 3]
    r = _run(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "1 of 6 requests failed" in r.stderr and "failures.jsonl" in r.stderr and "--resume" in r.stderr
    failures = [json.loads(x) for x in (tmp_path / "d" / "failures.jsonl").read_text().splitlines()]
    assert [f["index"] for f in failures] == [2] and "HTTP 400" in failures[0]["error"]
    answers = _answers(tmp_path / "d")
    assert sorted(answers) == [0, 1, 3, 4, 5]  # the 503s were retried; the failed one was never written
    _FaultProxy.poison = "no prompt contains this"
    assert _run(*args, "--resume").returncode == 0
    assert sorted(_answers(tmp_path / "d")) == list(range(N_PROMPTS))
    assert (tmp_path / "d" / "failures.jsonl").read_text() == ""


def test_bad_server_and_model_are_one_line_errors(server, tmp_path):
    prompts = _prompts(tmp_path)
    base = ["data", "generate", "--target", "tiny:llama", "--prompts", prompts, "--retries", 0]
    r = _run(*base, "--out", tmp_path / "a", "--server", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 2 and "cannot list models" in r.stderr and "Traceback" not in r.stderr
    r = _run(*base, "--out", tmp_path / "b", "--server", server, "--model", "nope")
    assert r.returncode == 2 and "--model 'nope': not served by" in r.stderr
    r = _run(*base, "--out", tmp_path / "c", "--server", server, "--self-prompts", 2)
    assert r.returncode == 2 and "--self-prompts" in r.stderr
    assert not (tmp_path / "a" / "responses.jsonl").exists()


# --- reasoning content: no server needed -------------------------------------------------

QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("msg", [
    {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France"},
    {"role": "assistant", "content": "Paris.", "reasoning": "The capital of France"},
    {"role": "assistant", "content": "<think>\nThe capital of France\n</think>\n\nParis."},
])
def test_reasoning_is_kept_where_the_template_renders_it_and_trained_on(msg):
    from eaglewire.data.lossmask import render_with_mask
    from eaglewire.data.server import assistant_message, template_renders_reasoning
    from eaglewire.targets.load import load_tokenizer

    tok = load_tokenizer("tiny:llama")
    assert not template_renders_reasoning(tok)
    user = {"role": "user", "content": "Capital of France?"}
    inline, had = assistant_message(msg, "keep", template_has_reasoning=False)
    assert had and inline == {"role": "assistant", "content": "<think>\nThe capital of France\n</think>\n\nParis."}
    stripped, had = assistant_message(msg, "strip", template_has_reasoning=False)
    assert had and stripped == {"role": "assistant", "content": "Paris."}
    tok.chat_template = QWEN3_LIKE
    assert template_renders_reasoning(tok)
    field, _ = assistant_message(msg, "keep", template_has_reasoning=True)
    assert field == {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France"}
    for kept in (field, inline):  # either way the thinking tokens are in the loss mask
        tok.chat_template = QWEN3_LIKE if kept is field else load_tokenizer("tiny:llama").chat_template
        ids, mask = render_with_mask(tok, [user, kept])
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert "The capital of France" in trained and "Paris." in trained


def test_no_reasoning_is_reported_as_none():
    from eaglewire.data.server import assistant_message

    out, had = assistant_message({"role": "assistant", "content": "  Paris. "}, "keep", template_has_reasoning=True)
    assert out == {"role": "assistant", "content": "Paris."} and not had
