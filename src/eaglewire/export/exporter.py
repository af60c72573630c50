"""`eaglewire export`: write a trained drafter in a serving engine's layout.

The ids written are computed from the physical capture points recorded in
the checkpoint's provenance, through `eaglewire.target.points` and nothing else: the
same drafter gets [1, 14, 26] for SGLang and [2, 15, 27] for vLLM because the
two engines mean different tensors by the same integer.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
from eaglewire.export.formats import (
    DRAFTER_KEY,
    ID_ENGINE,
    ID_KEY,
    build_config,
    canonical,
    format_ids,
    serving_engine,
    to_format_state,
)
from eaglewire.export.options import ExportConfig
from eaglewire.infra.atomic import atomic_dir, check_replace
from eaglewire.infra.errors import EaglewireError
from eaglewire.target.points import ENGINE_HELP, Engine, version_differences

RECORD = "eaglewire.export.json"


def _verifier(spec: str) -> dict | None:
    if not spec:
        return None
    p = Path(spec)
    arch: list = []
    if (p / "config.json").is_file():
        arch = json.loads((p / "config.json").read_text()).get("architectures") or []
    return {"name_or_path": spec, "architectures": arch}


def _write_dir(out: Path, files: dict) -> None:
    """Atomic: a temp dir renamed into place, so a failed export never leaves half a layout."""
    with atomic_dir(out) as tmp:
        for name, content in files.items():
            if isinstance(content, dict) and name.endswith(".safetensors"):
                save_file(content, str(tmp / name), metadata={"format": "pt"})
            else:
                (tmp / name).write_text(json.dumps(content, indent=2))


def run_export(cfg: ExportConfig) -> dict:
    fmt = canonical(cfg.format)
    replaced = check_replace(cfg.out, cfg.force, RECORD, "export", sources=(cfg.ckpt, resolve_dir(cfg.ckpt)))
    model, prov = load_checkpoint(cfg.ckpt)
    L, points = prov.num_layers, prov.points
    if points is None or L is None:
        raise EaglewireError(f"{cfg.ckpt}: the provenance names no capture points or layer count")
    eng = serving_engine(fmt, cfg.engine_version, prov.fingerprint.model_type)
    ids, why = format_ids(fmt, model.config, points, L, eng)
    if why:
        raise EaglewireError(f"{cfg.ckpt}: cannot export to {fmt} for {eng.label()}: " + "; ".join(why))
    warnings: list[str] = []
    if fmt == "sglang":
        w = version_differences(ids, Engine("sglang", None, eng.arch), L)
        if w:
            warnings.append(w + f"; these ids are written for {eng.label()}")
    if fmt == "speculators" and not cfg.verifier:
        warnings.append("no --verifier: speculators_config.verifier.name_or_path is null, and speculators 0.9.0 "
                        "Eagle3DraftModel.from_pretrained reads the verifier's config (it fails without one): "
                        "pass --verifier with the target's HF id or local directory")
    if fmt == "speculators" and model.config.fc_norm:
        warnings.append("fc_norm is stored as speculators fc_norm.<i>.weight; vLLM's llama_eagle3.py (as read at "
                        "00bd1493) has no fc_norm and would fail on these names: serve this one with speculators-aware vLLM only")
    if prov.fingerprint.unknown:
        warnings.append("the checkpoint's target is unknown (imported without --target): check the serving target yourself")
    config = build_config(fmt, model.config, ids, _verifier(cfg.verifier), cfg.speculative_tokens)
    tensors = to_format_state(fmt, model.config, model.state_dict())
    record = {"source": str(cfg.ckpt), "format": fmt, "points": [p.name for p in points], "target_num_layers": L,
              "ids": ids, "engine": eng.label(), "assumed": eng.assumptions(), "ids_meaning": ENGINE_HELP[ID_ENGINE[fmt]], "ids_key": ID_KEY[fmt], "warnings": warnings,
              "target_fingerprint": prov.fingerprint.to_json(), "chat_template_sha": prov.chat_template_sha,
              # the training-time layer config, so `doctor config` on this directory alone can check
              # rope/eps/norm placement even after the checkpoint is moved or deleted
              DRAFTER_KEY: model.config.to_dict()}
    _write_dir(cfg.out, {"config.json": config, "model.safetensors": tensors, RECORD: record})
    return {"out": str(cfg.out), **record, "num_tensors": len(tensors), "replaced": replaced}
