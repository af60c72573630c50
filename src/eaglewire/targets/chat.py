"""The target's chat template: rendering messages and encoding the result, one definition for data, decoding and serving.

Everything that turns messages into the target's tokens goes through here, so
a prompt is the same tokens whether it is trained on, decoded or sent to an
engine."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

SENTINEL_USER = "\x00SENTINEL_USER\x00"


SENTINEL_ASSISTANT = "\x00SENTINEL_ASSISTANT\x00"


# A chat template is code from the model's directory: jinja's sandbox stops file reads and attribute tricks,
# not loops (nested `range(99999)` ran for minutes). Real templates render in milliseconds and a few kB.
RENDER_SECONDS = float(os.environ.get("EAGLEWIRE_TEMPLATE_SECONDS", "10"))
MAX_RENDERED_CHARS = 16_000_000


class _TemplateTimeout(Exception):
    pass


def template_file(tokenizer) -> str:
    """Where the tokenizer's chat template came from, for an error line: the file a user can open."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    d = Path(name) if name else None
    for f in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if d is not None and (d / f).is_file():
            return str(d / f)
    return f"the chat template of tokenizer {name or '?'}"


@contextmanager
def _deadline(seconds: float):
    """SIGALRM raises into the render after `seconds`; an outer timer (pytest-timeout's) is put back after.

    Only the main thread receives signals: elsewhere the render runs unbounded in time (size is still checked).
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise _TemplateTimeout

    t0 = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, fire)
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer > 0:  # what was left of the outer timer keeps running
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 1e-3), interval)


def apply_chat_template(tokenizer, messages: list[dict], **kwargs):
    """`tokenizer.apply_chat_template` under a time and size bound: a template that loops or balloons
    is one error line naming its file, not a hang or an exhausted memory."""
    try:
        with _deadline(RENDER_SECONDS):
            out = tokenizer.apply_chat_template(messages, **kwargs)
    except _TemplateTimeout:
        raise EaglewireError(f"{template_file(tokenizer)}: the chat template did not finish rendering one "
                             f"conversation within {RENDER_SECONDS:g} s (a loop that never ends, or one far too "
                             "large); fix the template") from None
    text = out if isinstance(out, str) else None
    if text is not None and len(text) > MAX_RENDERED_CHARS:
        raise EaglewireError(f"{template_file(tokenizer)}: the chat template rendered {len(text):,} characters for one "
                             f"conversation (more than {MAX_RENDERED_CHARS:,}); fix the template")
    return out


def render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    """Render messages with the tokenizer's chat template, as a string.

    Strings (not token ids) are the common currency so the same rendering can
    be tokenized with or without offsets.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise EaglewireError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')}: has no chat_template "
            "(expected an instruct/chat model)"
        )
    try:
        return apply_chat_template(tokenizer, messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except EaglewireError:
        raise
    except Exception as e:  # jinja raise_exception(...) in templates, e.g. role alternation checks
        roles = ",".join(m.get("role", "?") for m in messages)
        raise EaglewireError(
            f"chat template rejected a conversation with roles [{roles}] ({type(e).__name__}: {e})"
        ) from e


def encode(tokenizer, text: str) -> list[int]:
    """Tokenize a rendered template; the template already contains any BOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def added_ids(tokenizer) -> set[int]:
    """Ids of added/special tokens (turn markers are always among them)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(tok, "special", True):
            ids.add(int(i))
    return ids


def first_added_in(tokenizer, text: str) -> int | None:
    special = added_ids(tokenizer)
    return next((i for i in encode(tokenizer, text) if i in special), None)


def assistant_end_ids(tokenizer) -> set[int]:
    """Tokens that end an assistant turn: eos plus the template's turn closer.

    The closer is the first special token the template emits after an
    assistant content (found by rendering a sentinel), e.g. ``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``.
    """
    msgs = [{"role": "user", "content": SENTINEL_USER}, {"role": "assistant", "content": SENTINEL_ASSISTANT}]
    text = render(tokenizer, msgs, add_generation_prompt=False)
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if SENTINEL_ASSISTANT in text:
        closer = first_added_in(tokenizer, text.split(SENTINEL_ASSISTANT, 1)[1])
        if closer is not None:
            ids.add(closer)
    return ids
