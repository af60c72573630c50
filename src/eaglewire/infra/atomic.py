"""Files and directories that appear whole or not at all.

Every artifact directory (a converted target, a tiny model, a checkpoint, an
export, training state) is written into a temporary sibling and renamed into
place, so a crash or a full disk never leaves half of one where a reader
would trust it. A directory being replaced is moved aside first and removed
only after the new one is in place. Single files rewritten while a job runs
(a manifest after every shard, a config, a stage marker, responses.jsonl) go
through `atomic_file`: a reader, or a resume after a crash, sees the old file
or the new one, never a torn one.

A temporary directory is held by its process (an exclusive `flock` on the
directory, which the kernel drops when the process dies, however it dies), so
the next run in the same place removes what a killed one left (a GGUF export
killed with -9 left a hidden 221 MB one) and never touches a live one's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import not_found, overlaps

# how a full disk reads once torch (its zip writer notices the short write later) or safetensors wrapped it
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "StorageFull", "os error 28", "unexpected pos",
               "file write failed")


def full_reason(e: BaseException | None) -> str | None:
    """"disk full" when `e`, or what it wraps, is a write that found the disk (or the quota) full; "file size
    limit reached" for a write past `ulimit -f`; None for anything else."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return "file size limit reached" if e.errno == errno.EFBIG else "disk full"
        if not isinstance(e, EaglewireError) and any(w in str(e) for w in _FULL_WORDS):
            return "disk full"
        if not isinstance(e, EaglewireError) and any(w in str(e) for w in ("File too large", "os error 27")):
            return "file size limit reached"
        e = e.__cause__ or e.__context__
    return None


def disk_full(e: BaseException | None) -> bool:
    return full_reason(e) is not None


@contextmanager
def on_disk_full(where: Path, what: str) -> Iterator[None]:
    """A full disk while the block writes `what` in `where` is one line (the caller keeps nothing half-written)."""
    try:
        yield
    except EaglewireError:
        raise
    except Exception as e:
        why = full_reason(e)
        if why is None:
            raise
        raise EaglewireError(f"{where}: {why} while writing {what} (nothing marked complete, earlier files kept; "
                             "free space and rerun, with --resume where the command takes it)") from e


STALE_AGE_S = 60  # younger temporary directories are left alone: their run may not have locked them yet
_MKDTEMP = re.compile(r"[a-z0-9_]{8}")  # what tempfile.mkdtemp appends (the names of earlier versions)


def _hold(d: Path) -> int | None:
    """An fd on directory `d` holding its exclusive flock; None when another process holds it (or the file
    system cannot say: then it is treated as held, and never removed)."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove the temporary directories `prefix`tmp-* (and earlier versions' `prefix`XXXXXXXX) in `parent` that
    no live process holds and that are older than STALE_AGE_S; the removed ones."""
    gone = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return gone
    for e in entries:
        rest = e.name[len(prefix):] if e.name.startswith(prefix) else None
        if rest is None or not (rest.startswith("tmp-") or _MKDTEMP.fullmatch(rest)):
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or time.time() - e.stat(follow_symlinks=False).st_mtime < STALE_AGE_S:
                continue
        except OSError:
            continue
        fd = _hold(Path(e.path))
        if fd is None:
            continue  # its run is alive
        try:
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(Path(e.path))
        finally:
            os.close(fd)
    return gone


@contextmanager
def owned_tmpdir(parent: Path, prefix: str) -> Iterator[Path]:
    """A temporary directory in `parent` held by this process while the block runs, removed after (unless the
    block renamed it away); what killed runs left under the same prefix is removed first."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent, prefix)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}tmp-", dir=parent))
    fd = _hold(tmp)
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if fd is not None:
            os.close(fd)


@contextmanager
def atomic_dir(out: Path):
    """Yield a temporary directory that replaces ``out`` when the block succeeds."""
    out = Path(out)
    old = out.with_name(f".{out.name}.old")
    with owned_tmpdir(out.parent, f".{out.name}.") as tmp:
        with on_disk_full(out.parent, f"{out.name}/"):
            yield tmp
        follow_umask(tmp)
        if old.exists():
            shutil.rmtree(old)
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[str]]:
    """Yield a text file that replaces ``path`` when the block succeeds.

    The data is fsync'd before the rename: without it a power cut can leave the
    renamed file empty on ext4/xfs, which is worse than the old version.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with on_disk_full(path.parent, path.name), open(tmp, "w") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any, default: Callable[[Any], Any] | None = str) -> None:
    """Replace ``path`` with ``data`` as indented JSON, all or nothing.

    ``default`` turns what JSON cannot hold into something it can, as in ``json.dump``
    (paths and the like become strings).
    """
    with atomic_file(path) as f:
        json.dump(data, f, indent=2, default=default)


def read_json(path: Path, missing: str) -> Any:
    """The JSON in ``path``; a missing or malformed file is one line naming the file and the fix (`missing`)."""
    path = Path(path)
    if not path.parent.exists():
        raise not_found(path.parent)
    if not path.is_file():
        raise EaglewireError(f"{path.parent}: {missing}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise EaglewireError(f"{path}: invalid JSON ({getattr(e, 'msg', e)}{where})") from e


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` (and what it holds) the modes a plain `open`/`mkdir` would have.

    mkdtemp makes 0700 directories and safetensors writes 0600 files: a serving
    engine running as another user could not read an export. Artifacts follow the umask.
    """
    path, mask = Path(path), _umask()
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in items:
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def check_replace(out: Path, force: bool, marker: str, kind: str, sources: tuple = ()) -> str | None:
    """Whether `--force` may replace `out`; None when there is nothing to replace, else what is replaced.

    `--force` replaces only an earlier artifact of the same kind (it holds `marker`),
    never the command's own input and never a directory of other files: renaming
    `out` aside and deleting it would otherwise lose whatever the user had there.
    """
    out = Path(out)
    if not out.exists():
        return None
    if not force:
        raise EaglewireError(f"--out {out}: already exists (pass --force to replace it)")
    if not out.is_dir():
        article = "an" if kind[:1] in "aeiou" else "a"
        raise EaglewireError(f"--out {out}: is a file, not {article} {kind} directory; --force does not replace it")
    for s in sources:
        s = Path(s).resolve()
        if overlaps(out, s):
            raise EaglewireError(f"--out {out}: is, holds or lies inside the input {s}; --force never replaces the input")
    others = [p.name for p in out.iterdir() if not p.name.startswith(".")]
    if others and not (out / marker).is_file():
        raise EaglewireError(f"--out {out}: holds {len(others)} other file(s) ({', '.join(sorted(others)[:3])}) and no "
                             f"{marker}: not an eaglewire {kind}; --force replaces only an earlier {kind}")
    return f"replaced the earlier {kind} in {out}"
