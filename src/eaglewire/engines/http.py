"""The HTTP client for OpenAI-compatible servers that generation, capture and serving share.

One client so every engine conversation gets the same whole-request deadline,
retry of transient failures and one-line errors. A caller that runs many
requests under one budget (`doctor live`) sets `deadline(...)`: every wait
below it (connect, each read, a retry's backoff) is cut to what is left, so a
server that trickles its answer cannot hold a check past its stated deadline.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from eaglewire.infra.errors import EaglewireError

_DEADLINE: ContextVar[tuple[float, str] | None] = ContextVar("eaglewire_http_deadline", default=None)


class DeadlineExpired(EaglewireError):
    """The caller's deadline for a whole series of requests ran out during a network wait."""


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Bound every request in the block by one deadline `seconds` from now; `what` names it in the error."""
    token = _DEADLINE.set((time.monotonic() + seconds, what))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def bounded(timeout: float) -> float:
    """`timeout`, cut to what is left of the enclosing `deadline` (DeadlineExpired when nothing is)."""
    d = _DEADLINE.get()
    if d is None:
        return timeout
    left = d[0] - time.monotonic()
    if left <= 0:
        raise DeadlineExpired(d[1])
    return min(timeout, left)


class RequestFailed(Exception):
    def __init__(self, msg: str, retryable: bool):
        super().__init__(msg)
        self.retryable = retryable


class ChatClient:
    """The few endpoints every OpenAI-compatible server has, with retries on transient errors."""

    def __init__(self, url: str, timeout_s: float = 600.0, retries: int = 4, backoff_s: float = 1.0,
                 max_bytes: int = 0, timeout_flag: str = "--request-timeout "):
        parsed = urllib.parse.urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise EaglewireError(f"--server {url!r}: expected a URL such as http://127.0.0.1:8000")
        base = str(url).rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_bytes, self.timeout_flag = max_bytes or MAX_REPLY_BYTES, timeout_flag

    def _once(self, path: str, body: dict | None) -> tuple[dict, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        timeout = bounded(self.timeout_s)
        until = time.monotonic() + timeout  # the whole request, not each read: a trickling server times out
        late = f"{path}: no complete reply within {self.timeout_flag}{self.timeout_s:g} s"
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                reply = json.loads(read_until(r, until, late, self.max_bytes).decode())
                return reply, dict(r.headers)
        except urllib.error.HTTPError as e:
            try:  # an error page is read under the same deadline, and only its first bytes
                detail = one_line(read_until(e, until, late, ERROR_BYTES, cut=True).decode(errors="replace"))[:300]
            except (RequestFailed, OSError, http.client.HTTPException):
                detail = ""
            raise RequestFailed(f"HTTP {e.code} from {path}: {detail}", e.code == 429 or e.code >= 500) from e
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, http.client.HTTPException) as e:
            raise RequestFailed(f"{self.base}{path}: {type(e).__name__}: {getattr(e, 'reason', e)}", True) from e
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deep
            raise RequestFailed(f"{path}: the server's reply is not JSON ({getattr(e, 'msg', e)})", True) from e

    def request(self, path: str, body: dict | None = None) -> tuple[dict, dict]:
        """Retry 429, 5xx and connection errors with exponential backoff; other 4xx fail at once."""
        for attempt in range(self.retries + 1):
            try:
                return self._once(path, body)
            except RequestFailed as e:
                if not e.retryable or attempt == self.retries:
                    raise
                time.sleep(bounded(min(self.backoff_s * 2 ** attempt, 30.0)))
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
ERROR_BYTES = 4096  # of an error page: enough for its message


def read_until(r, deadline: float, late: str, max_bytes: int = MAX_REPLY_BYTES, cut: bool = False) -> bytes:
    """The body of `r` by `deadline` (and the enclosing `deadline()`), at most `max_bytes` of it: a longer one is
    refused, or with `cut` its first `max_bytes` returned."""
    chunks, size = [], 0
    while True:
        bounded(0.0)  # the enclosing deadline(), when that is what ran out, names itself
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
        if size > max_bytes and cut:
            return b"".join(chunks)[:max_bytes]
        if size > max_bytes:
            raise RequestFailed(f"reply larger than {_size(max_bytes)}", False)


def one_line(text: str) -> str:
    """A server's text inside our one-line error: control characters (newlines, NUL, terminal escapes) as spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} kB"
