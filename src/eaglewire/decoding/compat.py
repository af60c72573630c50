"""Refuse a drafter that was not trained for this target (unless forced).

A drafter fed the wrong features decodes "fine" with tau ~ 1 (conventions
§7: shifted layer ids, wrong template, EAGLE-1 serving); the only useful
behaviour is to say what differs before decoding.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.fingerprint import TargetFingerprint, chat_template_hash
from eaglewire.targets.points import Point, parse_points


def drafter_mismatches(target, prov: Provenance, own: tuple[str, ...] | list[str] = ()) -> list[str]:
    """What differs between the target and the one the drafter was trained for: its fingerprint, the drafter
    kind's `own` differences (sizes, points), the chat template. Every drafter kind's loader asks this one."""
    diffs: list[str] = []
    fp = prov.fingerprint
    if fp.unknown:
        diffs.append("checkpoint has no target fingerprint")
    elif bad := fp.describe_mismatch(TargetFingerprint.of(target)):
        diffs.append("target fingerprint differs on " + bad)
    diffs.extend(own)
    sha = prov.chat_template_sha
    if sha and sha != chat_template_hash(target.tokenizer):
        diffs.append("chat template differs from the one the training data was rendered with")
    return diffs


def refuse_unless_forced(target, path: Path, diffs: list[str], force: bool, kind: str = "drafter") -> None:
    """A mismatch is refused in one line unless ``force``; forced, each is a warning (at the loader's caller)."""
    if diffs and not force:
        raise EaglewireError(f"{kind} {path} does not match target {target.source!r}: " + "; ".join(diffs)
                             + " (use --force to run anyway)")
    for d in diffs:
        warnings.warn(f"drafter {path}: {d} (forced)", stacklevel=3)


def _eagle3_mismatches(target, drafter, prov: Provenance) -> tuple[list[str], list[Point] | None]:
    """(an EAGLE-3 drafter's own differences: sizes and capture points, the points or None when unreadable)."""
    c, diffs = drafter.config, []
    if c.target_hidden_size != target.hidden_size:
        diffs.append(f"hidden size: drafter expects {c.target_hidden_size}, target has {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        diffs.append(f"vocab: drafter has {c.vocab_size}, target has {target.vocab_size}")
    points = None
    names = prov.point_names
    if not names:
        diffs.append("checkpoint names no capture points")
    else:
        try:
            points = parse_points(names, target.num_layers)
        except EaglewireError as e:
            diffs.append(f"capture points {names}: {e}")
        if points is not None and len(points) != c.num_aux:
            diffs.append(f"capture points: {len(points)} named, drafter fc takes {c.num_aux}")
    return diffs, points


def load_drafter_for(target, path: Path, force: bool = False):
    """Load a checkpoint on the target's device/dtype; refuse mismatches unless ``force``."""
    drafter, prov = load_checkpoint(Path(path), device=target.device, dtype=target.dtype)
    own, points = _eagle3_mismatches(target, drafter, prov)
    refuse_unless_forced(target, path, drafter_mismatches(target, prov, own), force)
    if points is None:
        raise EaglewireError(f"drafter {path}: cannot tell which target tensors to feed it (no usable capture points)")
    if drafter.config.vocab_size != target.vocab_size or target.hidden_size * len(points) != drafter.fc.in_features:
        raise EaglewireError(f"drafter {path}: shapes cannot be wired to target {target.source!r} even with --force")
    return drafter, points, prov
