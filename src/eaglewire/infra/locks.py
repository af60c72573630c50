"""One writer per artifact directory: an exclusive flock on ``<dir>/.eaglewire.lock``.

Why: two `data build --resume` runs into one directory interleave their
appends and renames and can leave a manifest that says complete over missing
samples. The lock is advisory (flock), released by the kernel when its holder
dies (so a kill -9 never leaves a stale lock), and re-entrant within one
process (`data build` runs generate, extract and vocab under one lock). The
file holds the holder's PID so the second writer's message can name it.

A clean exit also removes the lock file, and the directory when this run
created it and left nothing else in it: a command that failed before writing
anything (a bad --prompts file, an unknown target) leaves no empty directory
that a retry would then trip over. Removal is `rmdir`, which refuses a
directory that holds anything, so user data and a resumable run's answers
are never at risk.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

LOCK_NAME = ".eaglewire.lock"
_held: set[str] = set()  # resolved dirs this process holds


def _missing_dirs(d: Path) -> list[Path]:
    """`d` and those of its parents that do not exist yet, deepest first: what `mkdir -p d` creates."""
    out = []
    while not d.exists() and d != d.parent:
        out.append(d)
        d = d.parent
    return out


def _acquire(path: Path, d: Path, what: str) -> int:
    """Locked fd of `path`, retried when the holder removed that file as it let go (we then hold a stale inode)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EaglewireError(f"{d}: another eaglewire process (PID {holder}) is writing to this directory; "
                                 f"wait for it to finish or choose another output directory ({what})") from None
        try:
            st = os.stat(path)
            mine = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _release(fd: int, path: Path, created: list[Path]) -> None:
    """Remove the lock file while still holding it (see `_acquire`), then the empty dirs this run made."""
    try:
        path.unlink(missing_ok=True)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    for c in created:
        try:
            c.rmdir()
        except OSError:  # holds something (or a concurrent run's dir): never ours to delete
            return


@contextmanager
def dir_lock(d: Path, what: str):
    """Hold the directory's write lock for the block; raise EaglewireError naming the holder if taken."""
    d = Path(d)
    created = _missing_dirs(d)
    d.mkdir(parents=True, exist_ok=True)
    key = str(d.resolve())
    if key in _held:  # re-entered: the outermost holder releases
        yield
        return
    try:
        fd = _acquire(d / LOCK_NAME, d, what)
    except BaseException:
        _remove_empty(created)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.add(key)
    try:
        yield
    finally:
        _held.discard(key)
        _release(fd, d / LOCK_NAME, created)


@contextmanager
def waiting_lock(path: Path):
    """Blocking flock: a second process (a parallel test, another command) waits for a one-time build to finish."""
    with open(path, "w") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
