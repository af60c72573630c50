"""Regenerate answers through an OpenAI-compatible server (vLLM, SGLang, `transformers serve`, llama.cpp).

Why: a target worth a drafter rarely fits in this process. Users already serve
it with an engine on a GPU node, so answers come from that engine's
`/v1/chat/completions` and only extraction (or online training) runs the
target here. The local path's contract holds: rows are keyed by prompt
index and appended as they finish, so a rerun with ``--resume`` asks only
for what is missing; a request that fails after its retries is recorded in
``failures.jsonl`` and never written as an answer; the server's identity,
the sampling settings, how reasoning was handled and whether the server's
chat template tokenises prompts as ours does are recorded in the provenance.

Only the standard library talks HTTP, so a dataset machine needs no client
package.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from eaglewire.data.jsonl import JsonlAppender, rewrite_jsonl
from eaglewire.data.options import GenSettings
from eaglewire.infra.errors import EaglewireError

FAILURES = "failures.jsonl"
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_PROBE = "EAGLEWIRE_REASONING_PROBE"


@dataclass
class ServerSettings:
    url: str
    model: str | None = None
    concurrency: int = 8
    reasoning: str = "keep"
    retries: int = 4
    timeout_s: float = 600.0
    backoff_s: float = 1.0


class RequestFailed(Exception):
    def __init__(self, msg: str, retryable: bool):
        super().__init__(msg)
        self.retryable = retryable


class ChatClient:
    """The few endpoints every OpenAI-compatible server has, with retries on transient errors."""

    def __init__(self, url: str, timeout_s: float = 600.0, retries: int = 4, backoff_s: float = 1.0):
        parsed = urllib.parse.urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise EaglewireError(f"--server {url!r}: expected a URL such as http://127.0.0.1:8000")
        base = str(url).rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s

    def _once(self, path: str, body: dict | None) -> tuple[dict, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + self.timeout_s  # the whole request, not each read: a trickling server times out
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = _read_until(r, deadline, f"{path}: no complete reply within --request-timeout {self.timeout_s:g} s")
                reply = json.loads(raw.decode())
                return reply, dict(r.headers)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise RequestFailed(f"HTTP {e.code} from {path}: {detail}", e.code == 429 or e.code >= 500) from e
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, http.client.HTTPException) as e:
            raise RequestFailed(f"{self.base}{path}: {type(e).__name__}: {getattr(e, 'reason', e)}", True) from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestFailed(f"{path}: the server's reply is not JSON ({getattr(e, 'msg', e)})", True) from e

    def request(self, path: str, body: dict | None = None) -> tuple[dict, dict]:
        """Retry 429, 5xx and connection errors with exponential backoff; other 4xx fail at once."""
        for attempt in range(self.retries + 1):
            try:
                return self._once(path, body)
            except RequestFailed as e:
                if not e.retryable or attempt == self.retries:
                    raise
                time.sleep(min(self.backoff_s * 2 ** attempt, 30.0))
        raise AssertionError("unreachable")

    def identity(self, model: str | None) -> dict:
        """Which server and model answered: recorded so a dataset says where its answers came from."""
        try:
            models, headers = self.request("/v1/models")
        except RequestFailed as e:
            raise EaglewireError(f"--server {self.base}: cannot list models ({e})") from e
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
        if model is None:
            if not ids:
                raise EaglewireError(f"--server {self.base}: /v1/models lists no model; pass --model NAME")
            model = ids[0]
        elif ids and model not in ids:
            raise EaglewireError(f"--model {model!r}: not served by {self.base} (it serves: {', '.join(map(str, ids))})")
        info = {"url": self.base, "model": model, "served_models": ids, "server_header": headers.get("server")}
        for path in ("/version", "/get_server_info"):  # vLLM, SGLang; others 404 and are skipped
            try:
                info[path.strip("/")] = self._once(path, None)[0]
            except RequestFailed:
                pass
        return info


MAX_REPLY_BYTES = 64 << 20


def _read_until(r, deadline: float, late: str) -> bytes:
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise RequestFailed(late, True)
        block = r.read1(1 << 16) if hasattr(r, "read1") else r.read(1 << 16)
        if not block:
            want = r.headers.get("Content-Length")
            if want is not None and want.isdigit() and size < int(want):
                raise RequestFailed(f"IncompleteRead: the connection closed after {size} of {want} bytes", True)
            return b"".join(chunks)
        chunks.append(block)
        size += len(block)
        if size > MAX_REPLY_BYTES:
            raise RequestFailed(f"reply larger than {MAX_REPLY_BYTES >> 20} MB", False)


def _text_content(msg: dict) -> str | None:
    """The reply's text: a string, or the OpenAI list of parts joined; None when it is neither."""
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(str(p.get("text", "")) for p in content if p.get("type", "text") == "text")
    return None


def _split_reasoning(msg: dict) -> tuple[str, str | None]:
    """(answer, reasoning) whether the server parsed reasoning out or left `<think>` inline."""
    content = _text_content(msg) or ""
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning is None:
        m = _THINK.match(content)
        if m:
            reasoning, content = m.group(1).strip(), content[m.end():]
    return content.strip(), reasoning


def template_renders_reasoning(tokenizer) -> bool:
    """Whether the chat template writes an assistant's `reasoning_content` (Qwen3 style) or drops it."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}]
    try:
        return _PROBE in tokenizer.apply_chat_template(msgs, tokenize=False)
    except Exception:  # a template that rejects the extra key cannot render it  # noqa: BLE001
        return False


def assistant_message(msg: dict, mode: str, template_has_reasoning: bool) -> tuple[dict, bool]:
    """The assistant turn to store, and whether it carried reasoning.

    `keep` trains the drafter on the thinking the target produces (it drafts
    those tokens when serving too): in the template's own field when the
    template renders one, else inline as `<think>...</think>`. `strip` drops it.
    """
    content, reasoning = _split_reasoning(msg)
    out = {"role": "assistant", "content": content}
    if reasoning and mode == "keep":
        if template_has_reasoning:
            out["reasoning_content"] = reasoning
        else:
            out["content"] = f"<think>\n{reasoning}\n</think>\n\n{content}"
    return out, bool(reasoning)


def _body(model: str, msgs: list[dict], s: GenSettings, seed: int) -> dict:
    body = {"model": model, "messages": msgs, "max_tokens": s.max_new_tokens, "temperature": s.temperature}
    if s.temperature > 0:
        body.update(top_p=s.top_p, seed=seed)
    return body


@dataclass
class _Answer:
    index: int
    row: dict | None = None
    error: str | None = None


def _ask(client: ChatClient, model: str, item, s: GenSettings, ss: ServerSettings, with_reasoning: bool,
         tokenizer) -> _Answer:
    i, msgs, pids = item
    try:
        data, _ = client.request("/v1/chat/completions", _body(model, msgs, s, s.seed * 100003 + i))
        choice = data["choices"][0]
        msg, finish = choice["message"], choice.get("finish_reason")
    except RequestFailed as e:
        return _Answer(i, error=str(e))
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        return _Answer(i, error=f"reply without choices[0].message ({e!r})")
    if finish not in ("stop", "length", "eos"):
        # A cut-off or filtered reply is not an answer the target finished.
        return _Answer(i, error=f"finish_reason {finish!r} (expected stop or length)")
    why = _malformed(msg, data, s.max_new_tokens)
    if why:
        return _Answer(i, error=why)
    turn, had_reasoning = assistant_message(msg, ss.reasoning, with_reasoning)
    usage = data.get("usage") or {}
    n_new = usage.get("completion_tokens")
    if not isinstance(n_new, int):  # llama.cpp and others may omit usage: count with our tokenizer
        n_new = len(tokenizer(turn["content"], add_special_tokens=False)["input_ids"])
    if n_new > s.max_new_tokens + _SLACK_TOKENS:
        return _Answer(i, error=f"{n_new} answer tokens for a max_tokens {s.max_new_tokens} request")
    row = {"index": i, "messages": msgs + [turn], "prompt_tokens": len(pids), "response_tokens": n_new, "finish": "eos" if finish != "length" else "length",
           "server_prompt_tokens": usage.get("prompt_tokens"), "reasoning": had_reasoning}
    return _Answer(i, row=row)


_SLACK_TOKENS = 8  # servers count a stop token or two differently from us


def _malformed(msg, data: dict, max_new: int) -> str | None:
    """Why a 200 reply cannot be stored as an answer (None when it can)."""
    if not isinstance(msg, dict):
        return f"choices[0].message is {type(msg).__name__}, not an object"
    if "content" not in msg and not (msg.get("reasoning_content") or msg.get("reasoning")):
        return "reply without message.content (asked again on --resume)"
    text = _text_content(msg)
    if text is None:
        return f"message.content is {type(msg['content']).__name__}, not text"
    if len(text) > 64 * (max_new + _SLACK_TOKENS):  # no tokenizer makes 64 characters one token
        return f"an answer of {len(text)} characters for a max_tokens {max_new} request"
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return f"usage is {type(usage).__name__}, not an object"
    n = (usage or {}).get("completion_tokens")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        return f"usage.completion_tokens {n!r} is not a token count"
    return None


@dataclass
class ServerStats:
    failed: int = 0
    with_reasoning: int = 0
    prompt_tokens_checked: int = 0
    prompt_tokens_mismatched: int = 0


def _record(ans: _Answer, writer, stats, sstats: ServerStats, failures: list) -> None:
    if ans.error is not None:
        sstats.failed += 1
        failures.append({"index": ans.index, "error": ans.error})
        return
    row = ans.row
    spt = row.pop("server_prompt_tokens")
    if spt is not None:
        sstats.prompt_tokens_checked += 1
        sstats.prompt_tokens_mismatched += int(spt != row["prompt_tokens"])
    sstats.with_reasoning += int(row["reasoning"])
    if not row["messages"][-1]["content"] and not row["messages"][-1].get("reasoning_content"):
        stats.skipped_empty += 1
        writer.write({"index": row["index"], "skipped": "empty"})
        return
    stats.done += 1
    stats.new_tokens += row["response_tokens"]
    stats.finish[row["finish"]] = stats.finish.get(row["finish"], 0) + 1
    writer.write(row)
    writer.flush()


def generate_via_server(client: ChatClient, model: str, tokenizer, convs, out_path: Path, s: GenSettings,
                        ss: ServerSettings, resume: bool = False, share: tuple[int, int] = (0, 1)):
    """Like `generate_responses`, with `concurrency` requests in flight. Returns (GenStats, ServerStats)."""
    from eaglewire.data.generate import GenStats, pending_answers

    stats, sstats = GenStats(), ServerStats()
    todo = pending_answers(convs, out_path, tokenizer, s, stats, resume, share)
    with_reasoning = template_renders_reasoning(tokenizer)
    failures: list[dict] = []
    writer = JsonlAppender(out_path)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"generate via {client.base}", unit="sample", dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=ss.concurrency)
    try:
        futs = [pool.submit(_ask, client, model, item, s, ss, with_reasoning, tokenizer) for item in todo]
        for fut in as_completed(futs):
            _record(fut.result(), writer, stats, sstats, failures)
            stats.seconds = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(tok_s=f"{stats.tokens_per_s:.0f}", failed=sstats.failed)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        writer.close()
        bar.close()
        name = FAILURES if share[1] == 1 else f"failures.rank{share[0]}.jsonl"  # merged by rank 0
        rewrite_jsonl(out_path.parent / name, sorted(failures, key=lambda f: f["index"]))
    stats.seconds = time.perf_counter() - t0
    return stats, sstats, with_reasoning
