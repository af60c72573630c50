"""The dataset manifest: what every stored tensor physically is, and proof it is intact.

A dataset without provenance is how the seeds' team lost days: nobody could
say whether slot 0 held the embedding or layer 3. The manifest records the
capture points by physical name and by every engine's ids, the target's
fingerprint, the chat template hash, the generation settings and a checksum
per shard, and is rewritten atomically after every shard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglewire.infra.errors import EaglewireError
from eaglewire.target.load import file_sha256

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_manifest(d: Path) -> dict:
    p = Path(d) / MANIFEST
    if not p.is_file():
        raise EaglewireError(f"{d}: not an eaglewire dataset (no {MANIFEST})")
    try:
        m = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise EaglewireError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from e
    if m.get("format") != "eaglewire-features" or m.get("format_version") != FORMAT_VERSION:
        raise EaglewireError(f"{p}: format {m.get('format')!r} v{m.get('format_version')}, expected eaglewire-features v{FORMAT_VERSION}")
    return m


def manifest_hash(d: Path) -> str:
    return file_sha256(Path(d) / MANIFEST)[:16]


def shard_problem(d: Path, entry: dict) -> str | None:
    """Why a listed shard cannot be trusted (missing, wrong size, checksum), or None when it is intact."""
    p = Path(d) / entry["file"]
    if not p.is_file():
        return "missing"
    if p.stat().st_size != entry["bytes"]:
        return f"truncated or changed ({p.stat().st_size} bytes, manifest says {entry['bytes']})"
    if file_sha256(p) != entry["sha256"]:
        return "checksum mismatch (corrupt shard)"
    return None


def verify_shards(d: Path, m: dict) -> None:
    """Raise naming the first shard whose bytes differ from the manifest's checksum."""
    for s in m["shards"]:
        why = shard_problem(d, s)
        if why:
            raise EaglewireError(f"{Path(d) / s['file']}: {why}; run `eaglewire data extract {d} --resume` "
                                 "(bad or missing shards are re-extracted)")
