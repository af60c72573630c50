"""Paths the user typed that do not exist: say so, and name the close one that does.

Why: a typo (`runs/dta` for `runs/data`) used to surface as whatever the
first reader tripped over ("no manifest.json", "no responses"), which sends
the user looking inside a directory that is not there.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from eaglewire.infra.errors import EaglewireError


def close_match(p: Path) -> Path | None:
    """An existing path that differs from `p` in its first missing component only, when one is close."""
    p = Path(p)
    parts = p.parts
    for k in range(1, len(parts) + 1):
        head = Path(*parts[:k])
        if not head.exists():
            break
    else:
        return None
    try:
        names = [c.name for c in head.parent.iterdir() if not c.name.startswith(".")]
    except OSError:
        return None
    for name in difflib.get_close_matches(head.name, names, n=3, cutoff=0.6):
        guess = head.parent / name / Path(*parts[k:]) if k < len(parts) else head.parent / name
        if guess.exists():
            return guess
    return None


def close_path_hint(p: Path) -> str:
    """`` (did you mean <q>?)`` for a close existing path, else ""; to append to a message about `p`."""
    guess = close_match(p)
    return f" (did you mean {guess}?)" if guess else ""


def not_found(p: Path, what: str = "") -> EaglewireError:
    """``[what ]<p> does not exist (did you mean <q>?)`` as one line (`what`: e.g. "dataset directory")."""
    return EaglewireError(f"{what + ' ' if what else ''}{p} does not exist{close_path_hint(p)}")


def require_exists(p: Path, what: str = "") -> Path:
    """`p` itself when it exists; else raise :func:`not_found` (call before anything creates `p`)."""
    p = Path(p)
    if not p.exists():
        raise not_found(p, what)
    return p


def inside(root: Path, rel: object, where: str, symlinks: bool = False) -> Path:
    """``root / rel`` when `rel`, a path read from a file or a reply, stays inside `root`; else one line naming `where`.

    Every path that input names (a manifest's shard, an index's weight file, a
    server's reply) goes through here before anything reads, writes or deletes
    it: no absolute path, no `..`, and no symlink leading out of `root` unless
    ``symlinks`` (a model directory in the HF cache is a folder of symlinks to
    its blobs: the links are the directory's own, the name from the file is
    still checked).
    """
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise EaglewireError(f"{where}: expected a file name relative to {root}, got {rel!r}")
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise EaglewireError(f"{where}: {rel!r} points outside {root} (expected a path inside it, without '..')")
    full = Path(root) / p
    if not symlinks and not is_within(full, root):
        raise EaglewireError(f"{where}: {rel!r} resolves outside {root} (through a symlink); refused")
    return full


def is_within(p: Path, root: Path) -> bool:
    """Whether `p`, symlinks followed, is `root` or lies under it."""
    real, top = Path(os.path.realpath(p)), Path(os.path.realpath(root))
    return real == top or top in real.parents


def overlaps(a: Path, b: Path) -> bool:
    """Whether `a` and `b` (symlinks followed) are the same path or one holds the other."""
    return is_within(a, b) or is_within(b, a)
