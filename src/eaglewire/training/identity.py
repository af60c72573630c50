"""Which dataset a run trains on, by content, so a resumed run (and every torchrun rank) trains on the one the
run started on.

A path is no identity: the same relative `--data` names another directory from another working directory,
and a dataset rebuilt at the same path from another target or with other points is another dataset, while
a moved or copied dataset is the same one. The record holds what the drafter learns from: the target
fingerprint, the capture points, the draft vocabulary and the manifest's hash (online: the responses
file's); the absolute path is kept for the reader only, never compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from eaglewire.data.config import RESPONSES
from eaglewire.infra.checksums import short_sha
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.training.inputs import TrainInputs

# the content a resumed run must share with the run it continues, in the order a refusal names it
COMPARED = ("target", "points", "vocab", "manifest_sha", "responses_sha")


def dataset_identity(data: Path, inputs: TrainInputs) -> dict:
    """The record train.config.json keeps under `dataset` (JSON)."""
    prov, vocab = inputs.prov, inputs.vocab
    rec: dict[str, Any] = {"path": str(Path(data).resolve()), "target": prov.target.fingerprint.to_json(),
                           "points": list(inputs.manifest.point_names),
                           "vocab": {"size": vocab.size,
                                     "sha": short_sha(vocab.selected.to(torch.int64).contiguous().numpy().tobytes())}
                           if vocab is not None else {"size": None, "sha": "the target's whole vocabulary"}}
    ds = prov.dataset or {}
    if ds.get("online"):
        rec["responses_sha"] = ds.get("responses_sha")
    else:
        rec["manifest_sha"] = ds.get("manifest_sha")
    return rec


def _target_diff(a: Any, b: Any, where: str) -> str | None:
    old = TargetFingerprint.from_json(a, f"{where}.target")
    new = TargetFingerprint.from_json(b, f"{where}.target")
    fields = old.mismatch(new) if not (old.unknown or new.unknown) else ([] if old == new else ["unknown"])
    if not fields:
        return None
    ja, jb = old.to_json(), new.to_json()
    shown = [f for f in fields if f in ("model_type", "num_layers", "hidden_size", "vocab_size")] or fields
    return "target fingerprint differs in " + ", ".join(fields) + " (" + ", ".join(
        f"{k} {ja.get(k)} -> {jb.get(k)}" for k in shown[:3]) + ")"


def _names(points: Any) -> str:
    return "[" + ", ".join(map(str, points)) + "]" if isinstance(points, list) else repr(points)


def differences(old: dict, new: dict, where: str) -> list[str]:
    """What differs between two identities, one phrase each (empty when the same dataset)."""
    out = []
    for key in COMPARED:
        a, b = old.get(key), new.get(key)
        if key == "target":
            d = _target_diff(a, b, where)
            out += [d] if d else []
        elif a != b and key == "points":
            out.append(f"points {_names(a)} -> {_names(b)}")
        elif a != b and key == "vocab":
            fmt = lambda v: f"{v.get('size')} ids, sha {v.get('sha')}" if isinstance(v, dict) else repr(v)  # noqa: E731
            out.append(f"draft vocabulary {fmt(a)} -> {fmt(b)}")
        elif a != b:
            label = "manifest sha" if key == "manifest_sha" else f"{RESPONSES} sha"
            out.append(f"{label} {a} -> {b}")
    return out


def check_record(rec: Any, where: str) -> dict:
    """A recorded identity as written, or one line naming the damaged field (never a resume on a guess)."""
    if not isinstance(rec, dict):
        raise EaglewireError(f"{where}: field dataset = {rec!r:.80}: expected an object naming the dataset the run "
                             "started on (the record is damaged; start a new --out)")
    want = {"target": dict, "points": list, "vocab": dict}
    for key, typ in want.items():
        if not isinstance(rec.get(key), typ):
            raise EaglewireError(f"{where}: field dataset.{key} = {rec.get(key)!r:.80}: expected "
                                 f"{'an object' if typ is dict else 'a list'} (the record is damaged; start a new --out)")
    if not any(isinstance(rec.get(k), str) for k in ("manifest_sha", "responses_sha")):
        raise EaglewireError(f"{where}: field dataset.manifest_sha: expected the hash of the dataset the run started "
                             "on (the record is damaged; start a new --out)")
    return rec


def check_same_dataset(data: Path, out: Path, recorded: Any, now: dict) -> None:
    """A resumed run refuses another dataset, naming what differs; the same one spelled, moved or copied
    otherwise resumes."""
    where = str(out / "train.config.json")
    rec = check_record(recorded, where)
    diff = differences(rec, now, f"{where}: dataset")
    if diff:
        raise EaglewireError(f"{data}: not the dataset the run in {out} started on ({rec.get('path')}): "
                             f"{'; '.join(diff)}; resume with that dataset, or start a new --out")


def check_ranks_agree(identities: list[dict], data: Path) -> None:
    """Every torchrun rank trains on the same dataset (each reads its own `--data`: on another node, another
    directory)."""
    for r, ident in enumerate(identities[1:], start=1):
        diff = differences(identities[0], ident, "rank identity")
        if diff:
            raise EaglewireError(f"{data}: rank {r} reads another dataset than rank 0 ({ident.get('path')} vs "
                                 f"{identities[0].get('path')}): {'; '.join(diff)}; give every rank the same dataset")
