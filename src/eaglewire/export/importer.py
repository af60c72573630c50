"""`eaglewire import`: read an SGLang/SpecForge, vLLM, speculators or official
EAGLE drafter into an eaglewire checkpoint, saying what was read and what was assumed.

A foreign checkpoint rarely states everything: ids may be absent (the engine
then uses its default), the embedding may be missing (the official repo reads
it from the target), d2t/t2d may be absent (full vocabulary). Each such gap is
filled only with a rule that the format's own loader applies, and recorded in
the provenance under `imported.assumed`; facts derived from the tensors go
under `imported.inferred`. Unknown tensors are an error, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub.errors import (
    StrictDataclassError,  # transformers 5 validates config fields with it
)
from transformers import LlamaConfig

from eaglewire.drafter import DrafterConfig
from eaglewire.drafter.config import BOUNDS, MAX_DRAFTER_LAYERS, bounded_count
from eaglewire.drafter.vocabmap import duplicate_target
from eaglewire.export.config import ImportConfig
from eaglewire.export.dflash_io import run_import_dflash
from eaglewire.export.import_target import import_target
from eaglewire.export.written import RECORD
from eaglewire.infra.atomic import check_replace
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import checked_model, save_checkpoint
from eaglewire.saved.dflash_formats import is_dflash
from eaglewire.saved.formats import (
    FORMATS,
    ID_ENGINE,
    ID_KEY,
    NOT_SERVABLE_KEY,
    canonical,
    from_format_state,
    read_config_json,
)
from eaglewire.saved.provenance import FILE as PROVENANCE
from eaglewire.saved.provenance import Provenance
from eaglewire.saved.weights import read_weights
from eaglewire.targets.fingerprint import TargetRecord
from eaglewire.targets.points import (
    Engine,
    eagle3_default,
    points_from_ids,
    version_differences,
)


class Notes:
    """What the import read, derived and assumed; ends up in the provenance."""

    def __init__(self):
        self.inferred: list[str] = []
        self.assumed: list[str] = []
        self.warnings: list[str] = []


def detect_format(raw: dict, files: set[str]) -> str:
    if "speculators_model_type" in raw:
        return "speculators"
    if raw.get("eagle_aux_hidden_state_layer_ids"):
        return "vllm"
    if (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
        return "sglang"
    return "eagle"  # no ids anywhere: official layout (SGLang without ids means the same default)


def check_record(src: Path, fmt: str, raw: dict) -> None:
    """An eaglewire export says which format and ids it wrote (its record): a config.json that reads otherwise
    was edited or damaged, and importing it would wire the drafter to other layers without a word."""
    p = src / RECORD
    try:
        rec = json.loads(p.read_text()) if p.is_file() else None
    except (OSError, ValueError, RecursionError):
        rec = None  # unreadable: the config alone decides, as for any other tool's export
    if not isinstance(rec, dict) or rec.get("format") not in FORMATS:
        return
    cpath = src / "config.json"
    if rec["format"] != fmt:
        raise EaglewireError(f"{cpath}: reads as the {fmt} format, but {p} says eaglewire wrote it as "
                             f"{rec['format']} (the config was edited or damaged; --format {rec['format']} reads it so)")
    stored = _stored_ids(fmt, raw, Notes())
    if isinstance(rec.get("ids"), list) and stored is not None and stored != rec["ids"]:
        raise EaglewireError(f"{cpath}: {ID_KEY[fmt]} = {stored}, but {p} says eaglewire wrote {rec['ids']} "
                             "(the config was edited or damaged)")


def _llama_view(fmt: str, raw: dict) -> dict:
    if fmt != "speculators":
        return raw
    tl = raw.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise EaglewireError("config.json: speculators config without a transformer_layer_config object")
    return tl


def _norm_flags(fmt: str, raw: dict, notes: Notes) -> dict:
    """norm_before_fc / norm_output as the format's loader reads them (vLLM: top level, or eagle_config for the
    first); SGLang and the official code read neither, so a set flag there is named, not silently dropped."""
    nested = raw.get("eagle_config") or {}
    flags = {"norm_before_fc": bool(raw.get("norm_before_fc") or nested.get("norm_before_fc")),
             "norm_output": bool(raw.get("norm_output"))}
    if fmt in ("vllm", "speculators"):
        return flags
    for k, v in flags.items():
        if v:
            notes.warnings.append(f"{k}=true in config.json, but {fmt} does not read it: imported without it")
    return {}


def _fc_norm(fmt: str, raw: dict, sd: dict) -> bool:
    """Whether the drafter has per-slot fc norms: its weights say so, and for vLLM and speculators (which build
    the norms from config.json's `fc_norm` flag, llama_eagle3.py; speculators/algos.py copies the flag) the flag
    must agree, or the engine serves something else than the file holds: norms dropped, or refused at load."""
    has = any(k.startswith("fc_norm.") for k in sd)
    if fmt in ("vllm", "speculators") and bool(raw.get("fc_norm")) != has:
        if has:
            raise EaglewireError("config.json: the weights hold fc_norm.<i>.weight but fc_norm is not true: vLLM 0.32.0 "
                                 "builds no fc norms then and refuses those weights; set \"fc_norm\": true")
        raise EaglewireError("config.json: fc_norm = true but the weights hold no fc_norm.<i>.weight: vLLM 0.32.0 "
                             "would serve norms it never loaded; add the weights or drop the flag")
    return has


def _check_sizes(view: dict, raw: dict) -> None:
    """The sizes a config.json states, bounded by the file's own field names before anything is built."""
    bounds = {**BOUNDS, "num_hidden_layers": MAX_DRAFTER_LAYERS}
    for where in (view, raw) if view is not raw else (raw,):
        for k in ("num_hidden_layers", *BOUNDS):
            if where.get(k) is not None and k != "num_layers":
                bounded_count(k, where[k], bounds[k])


def drafter_config(fmt: str, raw: dict, sd: dict, notes: Notes) -> DrafterConfig:
    """DrafterConfig from the format's config plus tensor shapes (defaults = transformers LlamaConfig's)."""
    view = _llama_view(fmt, raw)
    _check_sizes(view, raw)
    # the shape of every weight follows from these: a default in their place (LlamaConfig's 4096 hidden) would
    # be reported as weights of the wrong shape, blaming the wrong file
    missing = [k for k in ("hidden_size", "num_attention_heads", "vocab_size") if view.get(k) is None]
    if missing:
        raise EaglewireError(f"config.json: {', '.join(missing)} missing (expected the draft layer's LlamaConfig "
                             "fields; every EAGLE-3 format writes them)")
    for k in ("num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings"):
        if k not in view:
            notes.assumed.append(f"{k} absent: transformers LlamaConfig default used")
    if "rope_theta" not in view and "rope_theta" not in (view.get("rope_parameters") or {}):
        notes.assumed.append("rope_theta absent: LlamaConfig default used")
    lc = LlamaConfig(**{k: v for k, v in view.items() if k not in ("architectures", "torch_dtype", "dtype")})
    hidden = int(lc.hidden_size)
    target_hidden = int(raw.get("target_hidden_size") or view.get("target_hidden_size") or hidden)
    fc = sd.get("fc.weight")
    if fc is None:
        raise EaglewireError("weights: no fc.weight (not an EAGLE-3 drafter: EAGLE-1/2 heads have no fc over 3 layers)")
    if fc.shape[1] % target_hidden:
        raise EaglewireError(f"fc.weight has shape {list(fc.shape)}: input width is not a multiple of target_hidden_size {target_hidden}")
    num_aux = fc.shape[1] // target_hidden
    notes.inferred.append(f"num_aux = {num_aux} (fc.weight input width {fc.shape[1]} / target_hidden_size {target_hidden})")
    dvs = raw.get("draft_vocab_size") or view.get("draft_vocab_size")
    if dvs is None:
        dvs = int(sd["lm_head.weight"].shape[0]) if "lm_head.weight" in sd else int(lc.vocab_size)
        notes.inferred.append(f"draft_vocab_size absent: {dvs} from lm_head.weight rows")
    if "norm_before_residual" in raw:
        nbr = bool(raw["norm_before_residual"])
    else:
        nbr = False
        notes.assumed.append(f"norm_before_residual absent: False ({fmt}'s own default"
                             + ("; note vLLM reads an absent value in a speculators config as True)" if fmt == "speculators" else ")"))
    try:
        return DrafterConfig.from_target_config(
            lc, draft_vocab_size=int(dvs), num_aux=num_aux, num_layers=int(view.get("num_hidden_layers", 1)),
            target_hidden_size=target_hidden, norm_before_residual=nbr,
            fc_norm=_fc_norm(fmt, raw, sd), **_norm_flags(fmt, raw, notes),
            tie_word_embeddings=bool(view.get("tie_word_embeddings", False)) if fmt != "speculators" else False)
    except ValueError as e:
        raise EaglewireError(f"config.json: {e}") from e


def refuse_disagreeing_ids(cpath: Path, raw: dict) -> None:
    """Ids at the top level (what vLLM reads) and under eagle_config (what SGLang reads) that disagree are refused,
    naming both: whichever list the import took, an engine reading the other would be wired to other layers."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top and nested and top != nested:
        raise EaglewireError(f"{cpath}: eagle_aux_hidden_state_layer_ids = {top} at the top level (what vLLM reads) "
                             f"but {nested} under eagle_config (what SGLang reads): which layers the drafter was "
                             "trained on cannot be told; keep the right list in both places, or in one")


# EAGLE-3 drafters whose draft layer is not a Llama decoder layer: their weights are another model's
# (vLLM 0.32 serves Eagle3DeepseekV2ForCausalLM from deepseek_eagle3.py: an MLA attention in the draft layer).
OTHER_DRAFT_LAYERS = {"Eagle3DeepseekV2ForCausalLM": "an MLA (DeepSeek-style latent attention) draft layer",
                      "Eagle3DeepseekV3ForCausalLM": "an MLA (DeepSeek-style latent attention) draft layer"}


def refuse_other_draft_layers(cpath: Path, raw: dict) -> None:
    """eaglewire's drafter is a Llama-layer EAGLE-3 head; importing another layer's weights into it would load
    none of them right, so such a drafter is refused by its class name, with the reason."""
    for arch in raw.get("architectures") or []:
        if arch in OTHER_DRAFT_LAYERS:
            raise EaglewireError(f"{cpath}: architectures {arch!r} is {OTHER_DRAFT_LAYERS[arch]}; eaglewire's drafter "
                                 "is a Llama decoder layer (LlamaForCausalLMEagle3), so these weights cannot be "
                                 "imported (serve it as published; `doctor config` still checks its ids)")


def _stored_ids(fmt: str, raw: dict, notes: Notes) -> list[int] | None:
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if fmt == "sglang":
        return nested
    if fmt in ("vllm", "speculators"):
        if not top and nested:
            notes.warnings.append(f"nested eagle_config ids {nested} present but {fmt} reads only the top-level key")
        return top or None
    return None


def _one_line(e: Exception) -> str:
    """transformers' strict config errors span lines; an error here is one line."""
    return "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())


def resolve_points(fmt: str, raw: dict, L: int, num_aux: int, layers_from: str, notes: Notes,
                   arch: str | None = None) -> tuple[list, dict]:
    """`arch` (the target's model_type, when --target is given) decides SGLang's per-architecture rule."""
    ids = _stored_ids(fmt, raw, notes)
    engine = layers_from or ID_ENGINE[fmt]
    rec = {"format": fmt, "ids_key": ID_KEY[fmt], "ids_found": ids, "engine": engine,
           "engine_source": "--layers-from" if layers_from else f"the {fmt} format's own meaning"}
    if ids is None:
        if num_aux != 3:
            raise EaglewireError(f"no layer ids stored and the drafter has {num_aux} feature slots: "
                                 "pass the ids' engine and values by editing config.json, or --layers-from with stored ids")
        pts = eagle3_default(L)
        notes.assumed.append(f"no ids stored: {fmt}'s default capture HF [2, L//2, L-3] = {[p.name for p in pts]} assumed")
        return pts, rec
    if len(ids) != num_aux:
        raise EaglewireError(f"config.json: {len(ids)} layer ids {ids} but fc.weight takes {num_aux} feature slots")
    eng = Engine.parse(engine, arch)
    try:
        pts = points_from_ids(list(ids), eng, L)
    except EaglewireError as e:
        raise EaglewireError(f"config.json: {ID_KEY[fmt]} = {ids}: {e}") from e
    notes.inferred.append(f"ids {ids} read as {eng.label()} ids -> {[p.name for p in pts]}")
    notes.assumed.extend(eng.assumptions())
    w = version_differences(list(ids), eng, L)
    if w:
        notes.warnings.append(w)
    return pts, rec


def _fill_vocab_maps(cfg: DrafterConfig, sd: dict, notes: Notes, where: Path | str = "weights") -> None:
    V, D = cfg.vocab_size, cfg.draft_vocab_size
    has_d, has_t = "d2t" in sd, "t2d" in sd
    if not has_d and not has_t:
        if D != V:
            raise EaglewireError(f"{where}: no d2t/t2d but draft_vocab_size {D} < vocab_size {V}: "
                                 "which target ids the draft vocab covers cannot be known")
        sd["d2t"], sd["t2d"] = torch.zeros(D, dtype=torch.long), torch.ones(V, dtype=torch.bool)
        notes.assumed.append("no d2t/t2d: full vocabulary, identity mapping (what the format's loader does)")
    elif has_t and not has_d:
        t2d = sd["t2d"].bool()
        ids = t2d.nonzero().flatten()
        if ids.numel() != D:
            raise EaglewireError(f"t2d marks {ids.numel()} target ids, draft_vocab_size is {D}")
        sd["d2t"] = ids - torch.arange(D)
        notes.inferred.append("d2t derived from t2d (ascending target ids)")
    elif not has_t:
        sd["d2t"] = _offsets_of(sd["d2t"].long(), V, notes, where)
        tgt = sd["d2t"] + torch.arange(sd["d2t"].numel())
        sd["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, tgt, True)
        notes.inferred.append("t2d derived from d2t")
    sd["d2t"] = sd["d2t"].long()
    sd["t2d"] = sd["t2d"].bool()
    if (dup := duplicate_target(sd["d2t"])) is not None:
        raise EaglewireError(f"{where}: d2t maps two draft ids to target id {dup} (a draft vocabulary names each "
                             "target token once; llama.cpp refuses such a file, vLLM would serve it wrongly)")


def _offsets_of(d2t: torch.Tensor, V: int, notes: Notes, where) -> torch.Tensor:
    """d2t as offsets, telling them from absolute target ids where only one reading is a draft vocabulary.

    EAGLE-3 stores offsets (target = draft + d2t[draft]); some tools store the target ids themselves.
    A reading is possible when every target id it gives is in [0, V) and none repeats. Offsets of a
    vocabulary with two neighbouring target ids repeat a value (so cannot be ids); ids past V - D read as
    offsets leave the vocabulary. Where both readings are possible nothing in the tensor decides, so
    the import stops rather than wire every draft token to another target token.
    """
    ar = torch.arange(d2t.numel())
    readings = {"offsets": d2t + ar, "absolute target ids": d2t}
    ok = [k for k, t in readings.items() if t.numel() and int(t.min()) >= 0 and int(t.max()) < V
          and duplicate_target(t - ar) is None]
    if ok == ["offsets"]:
        return d2t
    if ok == ["absolute target ids"]:
        notes.inferred.append("d2t holds absolute target ids (read as offsets they repeat or leave the vocabulary): "
                              "converted to offsets")
        return d2t - ar
    if not ok:
        raise EaglewireError(f"{where}: d2t maps draft ids outside the target vocab [0, {V}) or to one target id twice, read "
                             "as offsets (target = draft + d2t[draft]) and as absolute target ids alike")
    raise EaglewireError(f"{where}: d2t reads both as offsets (target = draft + d2t[draft], EAGLE-3's convention) and "
                         "as absolute target ids (target = d2t[draft]), and no t2d says which: add the t2d mask "
                         "(True at the draft vocabulary's target ids) to the weights")


def _target_facts(cfg: ImportConfig, sd: dict, dcfg: DrafterConfig, notes: Notes
                  ) -> tuple[int, TargetRecord, str | None]:
    """(layer count, the target record, its chat template hash); copies the embedding if missing."""
    L, record, chat_sha, t = import_target(cfg)
    if t is None:
        if "embed_tokens.weight" not in sd:
            raise EaglewireError("weights: no embed_tokens.weight (the official layout reads it from the target): "
                                 "pass --target to copy it")
        return L, record, chat_sha
    emb = t.model.get_input_embeddings().weight.detach().float().cpu()
    want = (dcfg.vocab_size, dcfg.hidden_size)
    if tuple(emb.shape) != want:
        raise EaglewireError(f"target {cfg.target!r}: embedding {list(emb.shape)} does not fit the drafter {list(want)}")
    if "embed_tokens.weight" not in sd:
        sd["embed_tokens.weight"] = emb.clone()
        notes.inferred.append(f"embed_tokens.weight copied from target {cfg.target!r}")
    elif not torch.equal(sd["embed_tokens.weight"].float(), emb):
        notes.warnings.append(f"the checkpoint's embedding differs from target {cfg.target!r}'s: "
                              "it was likely trained for another target (or another dtype)")
    return L, record, chat_sha


def run_import(cfg: ImportConfig) -> dict:
    src = Path(cfg.src)
    if src.is_dir() and (src / "config.json").is_file():
        cpath, raw = read_config_json(src)
        if is_dflash(raw):  # its own layouts and id numberings (export/dflash_io.py)
            return run_import_dflash(cfg, src, cpath, raw)
    replaced = check_replace(cfg.out, cfg.force, PROVENANCE, "checkpoint", sources=(src,))
    if cfg.layers_from:
        Engine.parse(cfg.layers_from)  # fails early, naming the accepted engines
    if not src.is_dir():
        raise EaglewireError(f"{src}: not a directory (expected a draft model directory with config.json)")
    cpath, raw = read_config_json(src)
    if isinstance(raw, dict) and NOT_SERVABLE_KEY in raw:  # ours, with no engine layout to read ids from
        why = "; ".join(r for rs in (raw[NOT_SERVABLE_KEY] or {}).values() for r in rs)
        raise EaglewireError(f"{cpath}: an eaglewire checkpoint that no engine serves as is ({why}): it needs no "
                             "import; use it directly, or `eaglewire export` it to a format that can express it")
    if not isinstance(raw.get("eagle_config", {}), dict):
        raise EaglewireError(f"{cpath}: eagle_config = {str(raw['eagle_config'])[:40]}: expected an object")
    refuse_disagreeing_ids(cpath, raw)
    refuse_other_draft_layers(cpath, raw)
    files = {p.name for p in src.iterdir()}
    fmt = detect_format(raw, files) if cfg.format == "auto" else canonical(cfg.format)
    if cfg.format == "auto":
        check_record(src, fmt, raw)
    notes = Notes()
    sd, wfile = read_weights(src, fmt)

    try:
        dcfg = drafter_config(fmt, raw, sd, notes)
    except EaglewireError as e:  # named by the file's name alone where it was raised: the full path here
        raise EaglewireError(str(e).replace("config.json: ", f"{cpath}: ", 1)) from e
    except (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError) as e:
        raise EaglewireError(f"{cpath}: {type(e).__name__}: {_one_line(e)} (expected a LlamaConfig's numbers, e.g. "
                             "\"hidden_size\": 2048)") from e
    sd = from_format_state(dcfg, sd)
    L, target, chat_sha = _target_facts(cfg, sd, dcfg, notes)
    _fill_vocab_maps(dcfg, sd, notes, src / wfile)
    pts, rec = resolve_points(fmt, raw, L, dcfg.num_aux, cfg.layers_from, notes, target.fingerprint.model_type)
    if dcfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd.get("embed_tokens.weight"))
    model = checked_model(dcfg, sd, src / wfile)
    imported = {"from": str(src), "weights": wfile, **rec, "inferred": notes.inferred, "assumed": notes.assumed,
                "warnings": notes.warnings}
    save_checkpoint(cfg.out, model, Provenance(points=pts, target=target, chat_template_sha=chat_sha, imported=imported))
    return {"out": str(cfg.out), "points": [p.name for p in pts], "target_num_layers": L, **imported, "replaced": replaced}

