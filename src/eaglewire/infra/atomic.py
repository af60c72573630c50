"""Directories that appear whole or not at all.

Every artifact directory (a converted target, a tiny model, a checkpoint, an
export, training state) is written into a temporary sibling and renamed into
place, so a crash or a full disk never leaves half of one where a reader
would trust it. A directory being replaced is moved aside first and removed
only after the new one is in place.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(out: Path):
    """Yield a temporary directory that replaces ``out`` when the block succeeds."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = out.with_name(f".{out.name}.old")
    try:
        yield tmp
        if old.exists():
            shutil.rmtree(old)
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
