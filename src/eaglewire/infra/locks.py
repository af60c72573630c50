"""One writer per artifact directory: an exclusive flock on ``<dir>/.eaglewire.lock``.

Why: two `data build --resume` runs into one directory interleave their
appends and renames and can leave a manifest that says complete over missing
samples. The lock is advisory (flock), released by the kernel when its holder
dies (so a kill -9 never leaves a stale lock), and re-entrant within one
process (`data build` runs generate, extract and vocab under one lock). The
file holds the holder's PID so the second writer's message can name it.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

LOCK_NAME = ".eaglewire.lock"
_held: set[str] = set()  # resolved dirs this process holds


@contextmanager
def dir_lock(d: Path, what: str):
    """Hold the directory's write lock for the block; raise EaglewireError naming the holder if taken."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    key = str(d.resolve())
    if key in _held:  # re-entered: the outermost holder releases
        yield
        return
    fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise EaglewireError(f"{d}: another eaglewire process (PID {holder}) is writing to this directory; "
                             f"wait for it to finish or choose another output directory ({what})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.add(key)
    try:
        yield
    finally:
        _held.discard(key)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
