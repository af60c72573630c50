"""Append-only JSONL with crash safety: a partial last line (killed writer) is dropped on read."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglewire.infra.atomic import atomic_file
from eaglewire.infra.errors import EaglewireError


def read_jsonl(path: Path, tolerate_partial_tail: bool = True) -> list[dict]:
    rows = []
    if not path.exists():
        return rows
    lines = path.read_text().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if tolerate_partial_tail and n == len(lines):  # unterminated last line: writer was killed
                break
            raise EaglewireError(f"{path}:{n}: invalid JSON ({e.msg})") from e
    return rows


def rewrite_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_file(path) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


class JsonlAppender:
    """Line-buffered appender; each row hits the disk before the next batch starts."""

    def __init__(self, path: Path):
        self.f = open(path, "a")

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.flush()
        self.f.close()
