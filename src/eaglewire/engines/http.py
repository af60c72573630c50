"""The HTTP client for OpenAI-compatible servers that generation, capture and serving share.

One client so every engine conversation gets the same whole-request deadline,
retry of transient failures and one-line errors.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request

from eaglewire.infra.errors import EaglewireError


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
                raw = read_until(r, deadline, f"{path}: no complete reply within --request-timeout {self.timeout_s:g} s")
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


def read_until(r, deadline: float, late: str) -> bytes:
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
