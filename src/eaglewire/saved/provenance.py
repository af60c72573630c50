"""What a drafter was trained on, stored beside its weights (`eaglewire.json`).

Engine configs cannot say which physical tensors fed the drafter in training;
this record can, and every command that serves, exports or checks a drafter
reads the capture points and the target from here. Version 2 stores the
target fingerprint once (under `target`); version-1 files (fingerprint also at
the top level, "unknown" strings for imported drafters) still read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.targets.points import Point, id_lists, parse_points

FORMAT = "eaglewire-drafter"
VERSION = 2
FILE = "eaglewire.json"


@dataclass
class Provenance:
    points: list[Point] | None  # the physical capture points the fc was trained on; None when unknown
    target: TargetRecord
    chat_template_sha: str | None = None
    dataset: dict | None = None  # {path, manifest_sha} or {path, online, responses_sha}; None when imported
    vocab: dict | None = None
    training: dict | None = None
    validation: dict | None = None
    split: dict | None = None  # the held-out split, so the doctor evaluates on samples never trained on
    imported: dict | None = None
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept as read

    @property
    def num_layers(self) -> int | None:
        return self.target.fingerprint.num_layers

    @property
    def fingerprint(self) -> TargetFingerprint:
        return self.target.fingerprint

    @property
    def point_names(self) -> list[str] | None:
        return [p.name for p in self.points] if self.points is not None else None

    @property
    def manifest_sha(self) -> str | None:
        return (self.split or {}).get("dataset_manifest_sha") or (self.dataset or {}).get("manifest_sha")

    def to_json(self) -> dict:
        d: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        L = self.num_layers
        d["points"] = id_lists(self.points, L) if self.points is not None and L else None
        d["target_num_layers"] = L
        d["target"] = self.target.to_json()
        for f in dataclasses.fields(self):
            if f.name not in ("points", "target", "extra"):
                d[f.name] = getattr(self, f.name)
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Provenance:
        if not isinstance(raw, dict):
            raise EaglewireError(f"{where}: expected a JSON object")
        if raw.get("format") not in (FORMAT, None) or raw.get("version", 1) not in (1, VERSION):
            raise EaglewireError(f"{where}: format {raw.get('format')!r} v{raw.get('version')}, "
                                 f"expected {FORMAT} v1 or v{VERSION}")
        if raw.get("points") is not None and not isinstance(raw["points"], dict):
            raise EaglewireError(f"{where}: points is {raw['points']!r:.40}: expected an object with a 'names' list")
        _check_types(raw, where)
        target = _target(raw, where)
        names = (raw.get("points") or {}).get("names") if isinstance(raw.get("points"), dict) else None
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise EaglewireError(f"{where}: points.names = {str(names)[:60]}: expected a list of capture point names")
        points = None
        if names and all(isinstance(n, str) for n in names):
            L = target.fingerprint.num_layers
            if L is None:
                raise EaglewireError(f"{where}: points {names} are named but the target's layer count is not recorded")
            try:
                points = parse_points(names, L)
            except EaglewireError as e:
                raise EaglewireError(f"{where}: capture points: {e}") from e
        own = {f.name for f in dataclasses.fields(cls)}
        skip = {"format", "version", "points", "target", "target_num_layers", "target_fingerprint"}
        known = {k: (None if v == "unknown" else v) for k, v in raw.items() if k in own and k not in skip}
        extra = {k: v for k, v in raw.items() if k not in own and k not in skip}
        return cls(points=points, target=target, extra=extra, **known)

    @classmethod
    def load(cls, d: Path) -> Provenance:
        p = Path(d) / FILE
        return cls.from_json(read_json(p, f"no {FILE} (not an eaglewire checkpoint; use `eaglewire import`)"), str(p))

    def save(self, d: Path) -> None:
        (Path(d) / FILE).write_text(json.dumps(self.to_json(), indent=2, default=str))


_OBJECTS = ("dataset", "vocab", "training", "validation", "split", "imported")


def _check_types(raw: dict, where: str) -> None:
    """What this version writes, typed: a damaged record is refused, never read as an imported drafter's
    (which records no target or points and so passes every wiring check it cannot make)."""
    for k in _OBJECTS:
        if raw.get(k) not in (None, "unknown") and not isinstance(raw[k], dict):
            raise EaglewireError(f"{where}: field {k} = {str(raw[k])[:40]}: expected an object or null")
    if raw.get("chat_template_sha") is not None and not isinstance(raw["chat_template_sha"], str):
        raise EaglewireError(f"{where}: field chat_template_sha = {str(raw['chat_template_sha'])[:40]}: expected a string")
    if raw.get("version") != VERSION:
        return  # version 1 (or unversioned): read as it was written
    if not isinstance(raw.get("target"), dict):
        raise EaglewireError(f"{where}: field target = {str(raw.get('target'))[:40]}: expected an object (the target's "
                             "source and fingerprint, which every version-2 record holds)")
    if raw.get("imported") is not None:
        return  # an imported drafter may know neither its target's fingerprint nor its points
    if not isinstance(raw["target"].get("fingerprint"), dict):
        raise EaglewireError(f"{where}: field target.fingerprint = {str(raw['target'].get('fingerprint'))[:40]}: "
                             "expected an object (a trained drafter records the target it was trained on)")
    if not isinstance((raw.get("points") or {}).get("names") if isinstance(raw.get("points"), dict) else None, list):
        raise EaglewireError(f"{where}: field points = {str(raw.get('points'))[:40]}: expected an object with the "
                             "'names' of the capture points it was trained on (a trained drafter records them)")


def _target(raw: dict, where: str) -> TargetRecord:
    """v2: `target` holds source and fingerprint. v1 also had the fingerprint at the top level
    (the only copy for imported drafters, whose `target` was null)."""
    rec = raw.get("target")
    if isinstance(rec, dict):
        t = TargetRecord.from_json(rec, f"{where}: target")
        if t.fingerprint.unknown and raw.get("target_fingerprint") not in (None, "unknown"):
            t = dataclasses.replace(t, fingerprint=TargetFingerprint.from_json(raw["target_fingerprint"],
                                                                             f"{where}: target_fingerprint"))
    else:
        t = TargetRecord(source=None, fingerprint=TargetFingerprint.from_json(raw.get("target_fingerprint"),
                                                                                f"{where}: target_fingerprint"))
    L = raw.get("target_num_layers")
    if t.fingerprint.num_layers is None and isinstance(L, int) and not isinstance(L, bool):
        t = dataclasses.replace(t, fingerprint=dataclasses.replace(t.fingerprint, num_layers=L))
    return t
