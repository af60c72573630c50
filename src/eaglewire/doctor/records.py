"""What an artifact records about its own making: the target, the export's engine, the wiring it was trained with, the export a server loaded."""

from __future__ import annotations

import json
from pathlib import Path

from eaglewire.export.written import RECORD
from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import read_provenance, resolve_dir
from eaglewire.saved.formats import DRAFTER_KEY, ID_ENGINE
from eaglewire.saved.provenance import FILE as PROVENANCE
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.registry import DOCTOR_ENGINES

SERVE_RECORD = "serve.json"  # beside the export `eaglewire serve` wrote: what its server loaded


def target_source_for(given: str, recorded: str | None, artifact: Path) -> str:
    """--target, else the target the artifact records; never a silent default for a foreign one."""
    if not (given or recorded):
        raise EaglewireError(f"{artifact}: records no target (made elsewhere): pass --target")
    return given or recorded


def exported_for(d: Path) -> str | None:
    """The engine an `eaglewire export` directory was written for (its record), so that checking it
    needs no --engine; None for anything else (a checkpoint, another tool's export)."""
    try:
        record = json.loads((Path(d) / RECORD).read_text())
        fmt, spec = record.get("format"), record.get("engine_spec")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    if isinstance(spec, str) and spec.partition("==")[0] in DOCTOR_ENGINES:
        return spec  # with the version the ids were written for (older records name the format only)
    engine = ID_ENGINE.get(fmt) if isinstance(fmt, str) else None
    return engine if engine in DOCTOR_ENGINES else None


def trained_wiring(src: Path) -> tuple[list[str] | None, int | None, str | None, str | None]:
    """(capture point names, target layers, target class (else model_type), chat template hash) the drafter was
    trained with: from a checkpoint's provenance, or from the record an `eaglewire export` writes."""
    if (src / PROVENANCE).is_file():
        p = read_provenance(src)
        return p.point_names, p.num_layers, p.fingerprint.arch or p.fingerprint.model_type, p.chat_template_sha
    if (src / RECORD).is_file():
        where = src / RECORD
        try:
            exp = json.loads(where.read_text())
        except (ValueError, RecursionError) as e:  # bad JSON, bytes that are not UTF-8, nesting too deep
            raise EaglewireError(f"{where}: not valid JSON ({str(e)[:80]}); re-export the drafter") from e
        if not isinstance(exp, dict):
            raise EaglewireError(f"{where}: expected a JSON object (the record `eaglewire export` writes)")
        fp = TargetFingerprint.from_json(exp.get("target_fingerprint"), f"{where}: target_fingerprint")
        points, layers = exp.get("points"), exp.get("target_num_layers")
        # every record `eaglewire export` writes holds both: without them the wiring would go unchecked
        if not isinstance(points, list) or not all(isinstance(n, str) for n in points):
            raise EaglewireError(f"{where}: points = {str(points)[:60]}: expected a list of capture point names")
        if isinstance(layers, bool) or not isinstance(layers, int) or not 0 < layers <= 10_000:
            raise EaglewireError(f"{where}: target_num_layers = {str(layers)[:40]}: expected a layer count (1..10000)")
        return points, layers, fp.arch or fp.model_type, exp.get("chat_template_sha")
    return None, None, None, None


def trained_model_config(src: Path) -> dict | None:
    """The draft layer's config at training time: in an eaglewire checkpoint, or recorded by the export.

    An export records it itself (older exports only name their source checkpoint, which may
    have moved): without it the rope/eps/norm rows cannot be checked at all.
    """
    return trained_entry(src, DRAFTER_KEY)


def trained_entry(src: Path, key: str) -> dict | None:
    """The checkpoint config entry `key` (the drafter's, DFlash's, P-EAGLE's) as trained: from the export record,
    the directory's own config.json, or the config.json of the checkpoint the record names (None: none has it)."""
    candidates = [src / RECORD, src / "config.json"]
    try:
        source = json.loads(candidates[0].read_text()).get("source")
        if isinstance(source, str) and source:
            candidates.append(resolve_dir(Path(source)) / "config.json")
    except (EaglewireError, ValueError, OSError, AttributeError, RecursionError):
        pass  # no record, or the checkpoint it came from is gone: only what the export recorded is known
    for p in candidates:
        try:
            raw = json.loads(p.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get(key), dict):
            return raw[key]
    return None


def recorded_field(d: Path, name: str) -> int | None:
    """An integer field of the record `eaglewire export` wrote in `d` (a DFlash or P-EAGLE export's mask token id,
    a P-EAGLE export's trained depths); None where no record says."""
    try:
        record = json.loads((Path(d) / RECORD).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    v = record.get(name) if isinstance(record, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _serve_record(ckpt: Path) -> tuple[Path, dict] | None:
    """(where, what) of the record `eaglewire serve` wrote beside this checkpoint's run, if any."""
    rec = ckpt.parent / "serve" / SERVE_RECORD
    if not rec.is_file():
        return None
    raw = read_json(rec, f"no {SERVE_RECORD}")
    if not isinstance(raw, dict):
        raise EaglewireError(f"{rec}: expected a JSON object (the record `eaglewire serve` writes)")
    return rec, raw


def recorded_export(ckpt: Path) -> Path | None:
    """The export `eaglewire serve` wrote for this checkpoint (what its server loaded), if any.

    serve writes it under the record's own directory, named relative to it; records written before that
    name it relative to serve's working directory, so an existing directory of that name inside the record's
    directory is taken too. A path leading elsewhere is refused (a record can come with a run from someone
    else), except the same name beside the record (a moved run).
    """
    found = _serve_record(ckpt)
    if found is None:
        return None
    rec, raw = found
    exp = raw.get("export")
    if not isinstance(exp, str) or not exp.strip():
        raise EaglewireError(f"{rec}: field export = {str(exp)[:40]}: expected the path of the export its server "
                             "loaded (rerun `eaglewire serve`, or remove the record)")
    home = rec.parent.resolve()
    path = Path(exp) if Path(exp).is_absolute() else rec.parent / exp
    inside = path.resolve().is_relative_to(home)
    if inside and path.exists():
        return path
    for old in (Path(exp), rec.parent / Path(exp).name):  # an older record's (cwd-relative), a moved run's
        if Path(exp).name not in ("", ".", "..") and old.exists() and old.resolve().is_relative_to(home):
            return old
    if not inside:
        raise EaglewireError(f"{rec}: field export = {exp[:80]}: outside {rec.parent} (serve writes its export there)")
    return path


def recorded_gate(ckpt: Path) -> tuple[float | None, Path | None]:
    """(the --spec-draft-p-min `eaglewire serve` started llama-server with, the record saying so): `doctor live`
    predicts with the server's gate, which llama-server does not report. (None, None) without a record or a gate."""
    found = _serve_record(ckpt)
    if found is None or found[1].get("p_min") in (None, 0):
        return None, None
    rec, raw = found
    p = raw["p_min"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise EaglewireError(f"{rec}: field p_min = {str(p)[:40]}: expected llama.cpp's --spec-draft-p-min, a number "
                             "in [0, 1) (rerun `eaglewire serve`, or pass doctor live --p-min)")
    return float(p), rec


def layer_config(cfg: dict) -> dict:
    """speculators' nested layer config, or the top level (a malformed nested one reads as absent, never a traceback)."""
    inner = cfg.get("transformer_layer_config")
    return inner if isinstance(inner, dict) and inner else cfg
