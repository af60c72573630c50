"""`eaglewire export`: write a trained drafter in a serving engine's layout.

The ids written are computed from the physical capture points recorded in
the checkpoint's provenance, through `eaglewire.targets.points` and nothing else: the
same drafter gets [1, 14, 26] for SGLang and [2, 15, 27] for vLLM because the
two engines mean different tensors by the same integer.
"""

from __future__ import annotations

import json
import shutil

from safetensors.torch import save_file

from eaglewire.drafter.vocabmap import duplicate_target
from eaglewire.export import gguf
from eaglewire.export.config import ExportConfig
from eaglewire.export.dflash_io import run_export_dflash
from eaglewire.export.peagle_io import peagle_entry, peagle_outputs, refuse_format
from eaglewire.export.written import RECORD, default_verifier, verifier_record, write_dir
from eaglewire.infra.atomic import atomic_dir, check_replace
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, resolve_dir
from eaglewire.saved.depth import DEPTH, resolved_depth
from eaglewire.saved.dflash import is_dflash_checkpoint
from eaglewire.saved.formats import (
    DRAFTER_KEY,
    ID_ENGINE,
    ID_KEY,
    build_config,
    canonical,
    format_ids,
    serving_engine,
    to_format_state,
)
from eaglewire.saved.weights import check_exported
from eaglewire.targets.points import ENGINE_HELP, Engine, version_differences
from eaglewire.targets.support import capture_refusal


def refuse_duplicate_targets(ckpt, model) -> None:
    """Every engine reads d2t as one target token per draft id; vLLM serves a repeated one wrongly without a word."""
    if (dup := duplicate_target(model.d2t)) is not None:
        raise EaglewireError(f"{ckpt}: d2t maps two draft ids to target id {dup} (a draft vocabulary names each target "
                             "token once; llama.cpp's converter refuses it, vLLM would serve it wrongly): rebuild the "
                             "draft vocabulary (`eaglewire data vocab`) and train again")


def run_export(cfg: ExportConfig) -> dict:
    if is_dflash_checkpoint(cfg.ckpt):  # its own layouts and id numbering (export/dflash_io.py)
        return run_export_dflash(cfg)
    peagle = peagle_entry(cfg.ckpt)  # an EAGLE-3 checkpoint plus mask_hidden (export/peagle_io.py)
    if peagle is not None:
        refuse_format(cfg.ckpt, cfg.format)
    if cfg.format.lower() in ("gguf", "llama.cpp"):
        return run_export_gguf(cfg)
    fmt = canonical(cfg.format)
    replaced = check_replace(cfg.out, cfg.force, RECORD, "export", sources=(cfg.ckpt, resolve_dir(cfg.ckpt)))
    model, prov = load_checkpoint(cfg.ckpt)
    refuse_duplicate_targets(cfg.ckpt, model)
    L, points = prov.num_layers, prov.points
    if points is None or L is None:
        raise EaglewireError(f"{cfg.ckpt}: the provenance names no capture points or layer count")
    eng = serving_engine(fmt, cfg.engine_version, prov.fingerprint.model_type)
    # an engine that refuses the target's class at startup cannot serve any drafter of it: said before writing
    if refusal := capture_refusal(ID_ENGINE[fmt], eng.version, prov.fingerprint.arch):
        raise EaglewireError(f"{cfg.ckpt}: cannot export to {fmt}: {refusal}")
    ids, why = format_ids(fmt, model.config, points, L, eng)
    if why:
        raise EaglewireError(f"{cfg.ckpt}: cannot export to {fmt} for {eng.label()}: " + "; ".join(why))
    warnings: list[str] = []
    if fmt == "sglang":
        w = version_differences(ids, Engine("sglang", None, eng.arch), L)
        if w:
            warnings.append(w + f"; these ids are written for {eng.label()}")
    verifier = verifier_record(cfg.verifier) if cfg.verifier else None
    if fmt == "speculators" and verifier is None:
        verifier = default_verifier(cfg.ckpt, prov.target.source)
    flags = [k for k in ("fc_norm", "norm_before_fc", "norm_output") if getattr(model.config, k)]
    if fmt in ("vllm", "speculators") and flags:
        warnings.append(f"{', '.join(flags)}: vLLM 0.32.0 serves these as trained (measured on the default target) but "
                        "older releases do not read them (none at 00bd1493) and would serve the drafter without them: "
                        "serve it with vLLM 0.32.0 or newer")
    if prov.fingerprint.unknown:
        warnings.append("the checkpoint's target is unknown (imported without --target): check the serving target yourself")
    k = resolved_depth(cfg.depth, peagle["depths"] if peagle is not None else DEPTH)
    config = build_config(fmt, model.config, ids, verifier, k)
    tensors = to_format_state(fmt, model.config, model.state_dict())
    if peagle is not None:
        config, tensors = peagle_outputs(fmt, model, config, tensors, k)
    check_exported(tensors, "f32", str(cfg.ckpt))  # written as float32: finite is what can be checked
    record = {"source": str(cfg.ckpt), "format": fmt, "points": [p.name for p in points], "target_num_layers": L,
              "ids": ids, "engine": eng.label(),
              # what `doctor config` on this directory checks against when no --engine is given
              "engine_spec": f"{eng.name}=={eng.version}" if eng.version else eng.name, "assumed": eng.assumptions(), "ids_meaning": ENGINE_HELP[ID_ENGINE[fmt]], "ids_key": ID_KEY[fmt], "warnings": warnings,
              "target_fingerprint": prov.fingerprint.to_json(), "chat_template_sha": prov.chat_template_sha,
              # the training-time layer config, so `doctor config` on this directory alone can check
              # rope/eps/norm placement even after the checkpoint is moved or deleted
              DRAFTER_KEY: model.config.to_dict()}
    if peagle is not None:  # what `serve` reads back: vLLM drafts in parallel only when told (saved/peagle.py)
        record.update(kind="p-eagle", mask_token_id=model.mask_token_id, depths=peagle["depths"], depth=k,
                      parallel_drafting=True)
    write_dir(cfg.out, {"config.json": config, "model.safetensors": tensors, RECORD: record})
    return {"out": str(cfg.out), **record, "num_tensors": len(tensors), "replaced": replaced}


def run_export_gguf(cfg: ExportConfig) -> dict:
    """The vLLM layout with llama.cpp's ids, staged and handed to llama.cpp's own converter."""
    outtype = gguf.check_type("--gguf-type", cfg.gguf_type)
    target_type = gguf.check_type("--target-gguf", cfg.target_gguf) if cfg.target_gguf else ""
    replaced = check_replace(cfg.out, cfg.force, RECORD, "export", sources=(cfg.ckpt, resolve_dir(cfg.ckpt)))
    model, prov = load_checkpoint(cfg.ckpt)
    refuse_duplicate_targets(cfg.ckpt, model)
    L, points = prov.num_layers, prov.points
    if points is None or L is None:
        raise EaglewireError(f"{cfg.ckpt}: the provenance names no capture points or layer count")
    ids = gguf.llama_ids(model.config, points, L, str(cfg.ckpt), prov.fingerprint.arch)
    source = cfg.verifier or prov.target.source
    if not source:
        raise EaglewireError(f"{cfg.ckpt}: the checkpoint records no target; pass --verifier with the target "
                             "(llama.cpp's converter takes the tokenizer and vocabulary from it)")
    target_dir = gguf.target_dir_for(source, L, str(cfg.ckpt))
    config = {**build_config("vllm", model.config, ids), "eagle_aux_hidden_state_layer_ids": ids}
    tensors = to_format_state("vllm", model.config, model.state_dict())
    gguf.check_range(tensors, outtype, str(cfg.ckpt))  # in the written type, before anything is written
    record = {"source": str(cfg.ckpt), "format": "gguf", "points": [p.name for p in points], "target_num_layers": L,
              "ids": ids, "engine": gguf.LLAMA_CPP.label(), "engine_spec": "llama.cpp", "assumed": [],
              "ids_meaning": ENGINE_HELP["llama.cpp"], "ids_key": gguf.ID_KEY, "warnings": [],
              "gguf_type": outtype, "drafter_gguf": gguf.DRAFTER_FILE, "target_dir": str(target_dir),
              "target_fingerprint": prov.fingerprint.to_json(), "chat_template_sha": prov.chat_template_sha,
              DRAFTER_KEY: model.config.to_dict()}
    with atomic_dir(cfg.out) as tmp:
        stage = tmp / "eaglewire-drafter"  # the converter names the model after this directory
        stage.mkdir()
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        (stage / "config.json").write_text(json.dumps(config, indent=2))
        gguf.write_drafter(stage, tmp / gguf.DRAFTER_FILE, outtype, target_dir)
        shutil.rmtree(stage)
        if target_type:
            record["target_gguf"] = str(gguf.target_gguf(source, target_type))
        (tmp / RECORD).write_text(json.dumps(record, indent=2))
    return {"out": str(cfg.out), **record, "num_tensors": len(tensors), "replaced": replaced}
