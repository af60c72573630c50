"""Content hashes: how artifacts name what they were made from, and how shards prove they are intact."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def short_sha(data: bytes) -> str:
    """16 hex digits: enough to tell artifacts apart, short enough to read in a report."""
    return hashlib.sha256(data).hexdigest()[:16]
