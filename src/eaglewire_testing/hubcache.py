"""A Hugging Face hub cache laid out as `hf download` leaves it, built from local files.

Written by hand (not through huggingface_hub) so the tests check eaglewire
against the layout itself: `<type>s--org--name/refs/main` holds the commit,
`snapshots/<commit>/<path>` are relative symlinks into `blobs/<hash>`.
"""

import hashlib
import os
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache: Path, repo_id: str, src: Path, repo_type: str = "model", commit: str = COMMIT) -> Path:
    """Put every file under `src` into `cache` as the snapshot `commit` of `repo_id`; return the snapshot dir."""
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for f in sorted(p for p in Path(src).rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snap
