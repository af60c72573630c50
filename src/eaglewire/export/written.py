"""What every export writes beside the weights, shared by the EAGLE-3 and the DFlash exporters: the record
file, speculators' verifier entry and the atomic write of a layout directory."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.hub import cached_snapshot, is_repo_id
from eaglewire.targets.load import resolve_target_dir

RECORD = "eaglewire.export.json"


def verifier_record(name: str, local: Path | None = None) -> dict:
    """speculators' verifier record: the name to load, the architectures from its config where it is here."""
    d = local if local is not None else Path(name)
    arch: list = []
    if (d / "config.json").is_file():
        arch = json.loads((d / "config.json").read_text()).get("architectures") or []
    return {"name_or_path": name, "architectures": arch}


def default_verifier(ckpt: Path, source: str | None) -> dict:
    """The target the drafter records, as speculators' `verifier`.

    speculators 0.9.0's `Eagle3DraftModel.from_pretrained` reads the verifier's
    config and fails on a null one, so an export that names no verifier only
    looks like it worked. A hub id in the local cache stays an id (the serving
    machine resolves it); a local name becomes the directory eaglewire loads the
    target from. A name that is neither here is refused rather than guessed:
    a relative path recorded elsewhere looks exactly like an `org/name` id.
    """
    fix = "pass --verifier with the target's HF id or local model directory"
    if not source:
        raise EaglewireError(f"{ckpt}: speculators needs the verifier (the target) and the checkpoint records none: {fix}")
    if not Path(source).expanduser().exists() and is_repo_id(source):
        try:
            return verifier_record(source, cached_snapshot(source, "model", f"recorded target {source!r}"))
        except EaglewireError as e:
            raise EaglewireError(f"{ckpt}: the recorded target {source!r} is neither a directory here nor in the local "
                                 f"HF cache, so it cannot be checked as a hub id: {fix}") from e
    try:
        d = resolve_target_dir(source).resolve()
    except EaglewireError as e:
        raise EaglewireError(f"{ckpt}: the recorded target {source!r} cannot be found here ({e}): {fix}") from e
    return verifier_record(str(d))


def write_dir(out: Path, files: dict) -> None:
    """Atomic: a temp dir renamed into place, so a failed export never leaves half a layout."""
    with atomic_dir(out) as tmp:
        for name, content in files.items():
            if isinstance(content, dict) and name.endswith(".safetensors"):
                save_file(content, str(tmp / name), metadata={"format": "pt"})
            else:
                (tmp / name).write_text(json.dumps(content, indent=2))
