"""Append-only JSONL with crash safety: a partial last line (killed writer) is dropped on read."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglewire.infra.atomic import atomic_file, on_disk_full
from eaglewire.infra.errors import EaglewireError


def read_jsonl(path: Path, tolerate_partial_tail: bool = True, check=None) -> list[dict]:
    """Rows of a JSONL file; `check(row)` returns why a row is unusable (None when it is fine)."""
    rows = []
    if not path.exists():
        return rows
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise EaglewireError(f"{path}:{line}: not UTF-8 (byte 0x{e.object[e.start]:02x}); expected a UTF-8 JSONL file") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
            if tolerate_partial_tail and n == len(lines):  # unterminated last line: writer was killed
                break
            cut = " (the last line is cut: its writer was killed or the file truncated)" if n == len(lines) else ""
            raise EaglewireError(f"{path}:{n}: invalid JSON ({getattr(e, 'msg', e)}){cut}") from e
        why = "expected a JSON object" if not isinstance(row, dict) else (check(row) if check else None)
        if why:
            raise EaglewireError(f"{path}:{n}: {why}")
        rows.append(row)
    return rows


ANSWER_IDS = "answer_ids"  # the token ids the target generated for the last (assistant) message


MAX_INDEX = 2**31 - 1  # a prompt's position: indices become int64 tensors and shard names


def index_problem(row: dict) -> str | None:
    """Why a row's `index` (its prompt's position) is unusable, if it is."""
    i = row.get("index")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_INDEX:
        return f"index is {i!r:.30}: expected the prompt's position, an integer from 0 to {MAX_INDEX}"
    return None


def response_problem(row: dict, vocab_size: int | None = None) -> str | None:
    """Why a `responses.jsonl` row cannot be rendered with the chat template (None when it can).

    With `vocab_size`, stored answer ids must also name tokens of that vocabulary.
    """
    if why := index_problem(row):
        return why
    if "messages" not in row:
        return None  # a skipped-prompt record: no answer to train on
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        return f"messages is {msgs!r:.40}: expected a list of {{role, content}} objects"
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {m!r:.60}: expected an object with string role and content"
    return _answer_ids_problem(row, vocab_size)


def _answer_ids_problem(row: dict, vocab_size: int | None) -> str | None:
    if row.get(ANSWER_IDS) is None:
        return None  # written before answer ids were stored, or by a server that gives none: its text is used
    ids, top = row[ANSWER_IDS], (vocab_size or 2 ** 31) - 1
    if not isinstance(ids, list) or not ids:
        return f"{ANSWER_IDS} is {ids!r:.40}: expected a non-empty list of token ids"
    bad = next((k for k, t in enumerate(ids) if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= top), None)
    if bad is not None:
        return f"{ANSWER_IDS}[{bad}] is {ids[bad]!r:.30}: expected a token id from 0 to {top}" + (
            " (the target's vocabulary)" if vocab_size else "")
    if row["messages"][-1]["role"] != "assistant":
        return f"{ANSWER_IDS} given, but the last message is {row['messages'][-1]['role']!r}, not the assistant's answer"
    return None


def rewrite_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_file(path) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


class JsonlAppender:
    """Line-buffered appender; each row hits the disk before the next batch starts."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.f = open(path, "a")

    def write(self, row: dict) -> None:
        with on_disk_full(self.path.parent, self.path.name):
            self.f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        with on_disk_full(self.path.parent, self.path.name):
            self.f.flush()
            os.fsync(self.f.fileno())

    def close(self) -> None:
        self.flush()
        self.f.close()
