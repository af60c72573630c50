"""A record of a complete build, written last and checked before a cached build is trusted.

Why: a full disk or a killed build leaves a cached file short (a kernel `.so`
cut at 100 kB killed every later process with SIGBUS when it was mapped), and
a marker or a timestamp says "up to date" over it. `seal` runs after a build
finished and passed its own check, and records each product's size and, where
hashing is cheap enough to do on every use, its sha256; `damage` says why a
cache no longer matches its record, so the caller rebuilds it (or falls back)
instead of loading it.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.checksums import file_sha256

RECORD = ".eaglewire-build.json"
NO_RECORD = f"no record of a complete build ({RECORD})"


def seal(root: Path, hashed: list[Path], sized: list[Path] = ()) -> None:
    """Record, in `root`, the sha256 and size of `hashed` and the size alone of `sized` (files under `root`)."""
    root = Path(root)
    files = {Path(p).relative_to(root).as_posix(): {"size": Path(p).stat().st_size} for p in sized}
    for p in hashed:
        files[Path(p).relative_to(root).as_posix()] = {"size": Path(p).stat().st_size, "sha256": file_sha256(Path(p))}
    write_json_atomic(root / RECORD, {"version": 1, "files": files})


def damage(root: Path) -> str | None:
    """Why the build in `root` does not match its record (NO_RECORD when it has none); None when it does."""
    root = Path(root)
    try:
        files = json.loads((root / RECORD).read_text())["files"]
    except FileNotFoundError:
        return NO_RECORD
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return f"{RECORD} is unreadable"
    if not isinstance(files, dict) or not files:
        return f"{RECORD} lists no files"
    for rel, want in files.items():
        why = _file_damage(root, rel, want)
        if why is not None:
            return why
    return None


def _file_damage(root: Path, rel: str, want) -> str | None:
    parts = PurePosixPath(rel).parts
    if not isinstance(want, dict) or not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
        return f"{RECORD} has an entry {rel[:60]!r} that is not a file of the build"
    p = root.joinpath(*parts)
    try:
        size = p.stat().st_size
    except OSError:
        return f"{rel} is missing"
    if size != want.get("size"):
        return f"{rel} is {size} bytes, {want.get('size')} when it was built (cut short by a full disk or a kill?)"
    if "sha256" in want and file_sha256(p) != want["sha256"]:
        return f"{rel} differs from the file that was built (sha256)"
    return None
