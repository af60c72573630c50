"""`eaglewire export` and `import` of DFlash drafters (dispatched from exporter.py and importer.py).

Why here and not in the EAGLE-3 paths: a DFlash drafter has no d2t, no
lm_head and another id numbering. The ids written come from the physical
points recorded in the checkpoint's provenance, through
`targets/dflash_ids.py` only; an import names the numbering it read
("z-lab ids [1, 14, 28] = layers.1/14/28.out") so that the classic
off-by-one (z-lab ids under the speculators key) is visible, not silent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.export import gguf
from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.import_target import import_target
from eaglewire.export.written import RECORD, default_verifier, verifier_record, write_dir
from eaglewire.infra.atomic import atomic_dir, check_replace
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved import dflash_formats as dff
from eaglewire.saved.checkpoint import resolve_dir
from eaglewire.saved.dflash import (
    DFLASH_KEY,
    check_tensors,
    load_dflash_checkpoint,
    save_dflash_checkpoint,
)
from eaglewire.saved.provenance import FILE as PROVENANCE
from eaglewire.saved.provenance import Provenance
from eaglewire.saved.weights import check_exported, read_weights
from eaglewire.targets.dflash_ids import CONVENTIONS, dflash_ids_for_points
from eaglewire.targets.fingerprint import TargetRecord
from eaglewire.targets.support import dflash_capture_refusal


def run_export_dflash(cfg: ExportConfig) -> dict:
    fmt = dff.canonical(cfg.format)
    outtype = gguf.check_type("--gguf-type", cfg.gguf_type) if fmt == "gguf" else None
    replaced = check_replace(cfg.out, cfg.force, RECORD, "export", sources=(cfg.ckpt, resolve_dir(cfg.ckpt)))
    model, prov = load_dflash_checkpoint(cfg.ckpt)
    L, points = prov.num_layers, list(prov.points or [])
    dff.check_exportable(fmt, points, L, str(cfg.ckpt))
    if refusal := dflash_capture_refusal(dff.ENGINE[fmt], None, prov.fingerprint.arch):  # as the EAGLE-3 export
        raise EaglewireError(f"{cfg.ckpt}: cannot export to {fmt}: {refusal}")
    verifier = None
    if fmt == "speculators":
        verifier = verifier_record(cfg.verifier) if cfg.verifier else default_verifier(cfg.ckpt, prov.target.source)
    config, ids = dff.export_config(fmt, model.config, L, verifier)
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    check_exported(tensors, "f32", str(cfg.ckpt))
    conv = dff.CONVENTION[fmt]
    warnings = ["the checkpoint's target is unknown (imported without --target): check the serving target "
                "yourself"] if prov.fingerprint.unknown else []
    record = {"source": str(cfg.ckpt), "format": fmt, "kind": "dflash", "points": [p.name for p in points],
              "target_num_layers": L, "ids": ids, "ids_key": dff.ID_KEY[fmt], "ids_convention": conv,
              "ids_meaning": CONVENTIONS[conv][1], "ids_written": dff.ids_label(ids, conv, points),
              "engine": dff.ENGINE[fmt], "engine_spec": dff.ENGINE[fmt], "assumed": [], "warnings": warnings,
              "block_size": model.config.block_size, "mask_token_id": model.config.mask_token_id,
              "target_fingerprint": prov.fingerprint.to_json(), "chat_template_sha": prov.chat_template_sha}
    if fmt == "gguf":
        _write_gguf(cfg, config, tensors, outtype, prov, record)
    else:
        write_dir(cfg.out, {"config.json": config, "model.safetensors": tensors, RECORD: record})
    return {"out": str(cfg.out), **record, "num_tensors": len(tensors), "replaced": replaced}


def _write_gguf(cfg: ExportConfig, config: dict, tensors: dict, outtype: str, prov: Provenance, record: dict) -> None:
    """The z-lab layout staged and handed to llama.cpp's own converter (its DFlashModel writes ids + 1)."""
    source = cfg.verifier or prov.target.source
    if not source:
        raise EaglewireError(f"{cfg.ckpt}: the checkpoint records no target; pass --verifier with the target "
                             "(llama.cpp's converter takes the tokenizer and vocabulary from it)")
    target_dir = gguf.target_dir_for(source, record["target_num_layers"], str(cfg.ckpt))
    tc = json.loads((target_dir / "config.json").read_text())  # read and checked by target_dir_for
    vocab = (tc.get("text_config") if isinstance(tc.get("text_config"), dict) else tc).get("vocab_size")
    if vocab != config["vocab_size"]:  # the converter asserts it, in a traceback; said here in one line
        raise EaglewireError(f"{cfg.ckpt}: the drafter's vocab_size {config['vocab_size']} is not the target's "
                             f"{vocab} ({target_dir}): a DFlash drafter reads the target's embedding and head")
    gguf.check_range(tensors, outtype, str(cfg.ckpt))
    record.update(gguf_type=outtype, drafter_gguf=gguf.DRAFTER_FILE, target_dir=str(target_dir))
    with atomic_dir(cfg.out) as tmp:
        stage = tmp / "eaglewire-dflash"  # the converter names the model after this directory
        stage.mkdir()
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        (stage / "config.json").write_text(json.dumps(config, indent=2))
        gguf.write_drafter(stage, tmp / gguf.DRAFTER_FILE, outtype, target_dir)
        shutil.rmtree(stage)
        (tmp / RECORD).write_text(json.dumps(record, indent=2))


# --- import ------------------------------------------------------------------------------------------


def _target(cfg: ImportConfig, dcfg, where: str) -> tuple[int, TargetRecord, str | None]:
    """(layer count, target record, chat template hash) as the EAGLE-3 import takes them (import_target.py);
    the drafter must fit the target's embedding and head."""
    L, record, chat_sha, t = import_target(cfg, "DFlash ids")
    if t is not None:
        rows, width = t.model.get_input_embeddings().weight.shape
        if (dcfg.hidden_size, dcfg.vocab_size) != (width, rows):
            raise EaglewireError(f"{where}: hidden_size {dcfg.hidden_size} / vocab_size {dcfg.vocab_size}, but "
                                 f"target {cfg.target!r} embeds {rows} tokens in {width} (a DFlash drafter uses the "
                                 "target's embedding and head)")
    return L, record, chat_sha


def run_import_dflash(cfg: ImportConfig, src: Path, cpath: Path, raw: dict) -> dict:
    replaced = check_replace(cfg.out, cfg.force, PROVENANCE, "checkpoint", sources=(src,))
    if DFLASH_KEY in raw:
        raise EaglewireError(f"{cpath}: already an eaglewire DFlash checkpoint: it needs no import; use it directly")
    if cfg.format not in ("auto", "sglang", "vllm", "speculators"):
        raise EaglewireError(f"--format {cfg.format} for a DFlash drafter: expected auto, sglang or vllm (z-lab "
                             "layout) or speculators")
    layout, ids, _, _ = dff.stored_ids(raw, str(cpath))
    want = "speculators" if cfg.format == "speculators" else "zlab" if cfg.format != "auto" else layout
    if want != layout:
        raise EaglewireError(f"{cpath}: --format {cfg.format} but this is the {layout} DFlash layout")
    provisional = list(range(len(ids)))  # the shape check needs a valid id list; the real ids come with the target
    dcfg = dff.drafter_config(raw, layout, provisional, str(cpath))
    L, target, chat_sha = _target(cfg, dcfg, str(cpath))
    rec = dff.read_points(raw, L, str(cpath), cfg.layers_from)
    pts = rec.pop("points")
    dcfg = dff.drafter_config(raw, layout, rec["zlab_ids"], str(cpath))
    sd, wfile = read_weights(src, "vllm")
    sd = {k: v for k, v in sd.items() if not (k in ("d2t", "t2d") and layout == "speculators")}
    model = _checked(dcfg, sd, src / wfile)
    notes = {"from": str(src), "weights": wfile, "kind": "dflash", "format": layout,
             "engine_source": "--layers-from" if cfg.layers_from else f"the {layout} layout's own numbering", **rec,
             "assumed": [], "inferred": [rec["ids_read"]], "warnings": []}
    prov = Provenance(points=pts, target=target, chat_template_sha=chat_sha, imported=notes)
    save_dflash_checkpoint(cfg.out, model, prov)
    return {"out": str(cfg.out), "points": [p.name for p in pts], "target_num_layers": L, **notes,
            "vllm_ids": dflash_ids_for_points(pts, "vllm", L), "replaced": replaced}


def _checked(dcfg, sd: dict, where: Path) -> DFlashDrafter:
    """The drafter with exactly these tensors (saved/dflash.py's strict check), its weights in fp32."""
    check_tensors(dcfg, sd, where)
    model = DFlashDrafter(dcfg)
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return model
