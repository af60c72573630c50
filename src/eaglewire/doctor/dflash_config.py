"""`doctor config` for a DFlash drafter: which key each engine reads, what it feeds, and the fix.

A DFlash config.json can name its layers under two keys with two meanings
(docs/parallel-drafters.md section 2): `dflash_config.target_layer_ids` (z-lab
ids, id k = `layers.{k}.out`, read by SGLang 0.5.23 and, +1, by vLLM 0.32.0)
and the vLLM/speculators ids (k+1: top-level `eagle_aux_hidden_state_layer_ids`,
speculators' `aux_hidden_state_layer_ids`; llama.cpp's GGUF `dflash.target_layers`).
vLLM reads the top-level key first, so a file carrying both, written in two
meanings, is served on other layers by vLLM and on the right ones by SGLang:
the same drafter is fine on one engine and miswired on the other, and only
the id arithmetic of each engine's reader tells which. The EAGLE-3 rules of
SGLang (DeepSeek first id, GPT-OSS last id) do not apply to DFLASH: every
model file's `set_dflash_layers_to_capture` adds +1 unconditionally.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from eaglewire.doctor.gguf_config import find_gguf, read_gguf_meta
from eaglewire.doctor.records import recorded_field, trained_entry
from eaglewire.doctor.verdict import Report
from eaglewire.drafter.dflash import default_target_layer_ids
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import DFLASH_KEY
from eaglewire.saved.formats import read_config_json
from eaglewire.targets.dflash_ids import (
    VLLM_DEFAULT_KEY,
    check_dflash_points,
    dflash_ids_for_points,
    dflash_problems,
    points_from_dflash_ids,
    vllm_reads_dflash,
)
from eaglewire.targets.points import Engine, Point
from eaglewire.targets.support import dflash_capture_refusal

ZLAB_KEY = "dflash_config.target_layer_ids"
EAGLE_KEY = "eagle_aux_hidden_state_layer_ids"
SPEC_KEY = "aux_hidden_state_layer_ids"
GGUF_KEY = "dflash.target_layers"
_CONVENTION = {ZLAB_KEY: "zlab", "target_layer_ids": "zlab", EAGLE_KEY: "vllm", SPEC_KEY: "speculators",
               "eagle_config.eagle_aux_hidden_state_layer_ids": "vllm", GGUF_KEY: "llama.cpp"}


def is_dflash_config(cfg: dict) -> bool:
    arch = " ".join(a for a in (cfg.get("architectures") or []) if isinstance(a, str))
    return "DFlash" in arch or cfg.get("speculators_model_type") == "dflash" or "dflash_config" in cfg


def _speculators_layout(cfg: dict) -> bool:
    return cfg.get("speculators_model_type") == "dflash"


def _id_list(ids, key: str, where: Path) -> list[int]:
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise EaglewireError(f"{where}: {key} = {str(ids)[:60]}: expected a list of integer layer ids")
    return ids


def _nested(cfg: dict, where: Path) -> list[int] | None:
    """SGLang's `parse_dflash_draft_config`: dflash_config first, the top-level key as fallback."""
    inner = cfg.get("dflash_config")
    if inner is not None and not isinstance(inner, dict):
        raise EaglewireError(f"{where}: dflash_config = {str(inner)[:60]}: expected an object")
    ids = (inner or {}).get("target_layer_ids")
    return None if ids is None else _id_list(ids, ZLAB_KEY, where)


def engine_reads(cfg: dict, eng: Engine, L: int, where: Path) -> tuple[str, list[int] | None, list[Point]]:
    """(key the engine reads, its ids (None: absent, the engine's default fed), the points it feeds in slot order).

    Raises EaglewireError (naming the id) when an id means a point the engine cannot capture.
    """
    if eng.name in ("vllm", "speculators"):
        ids, key, points = vllm_reads_dflash(cfg, L)
        if key == VLLM_DEFAULT_KEY:
            return f"no ids ({key})", None, list(points)
        if key == ZLAB_KEY:  # the ids as written there (vLLM adds 1 to each)
            ids = _nested(cfg, where)
        return (SPEC_KEY if _speculators_layout(cfg) and key == EAGLE_KEY else key), ids, list(points)
    if eng.name == "sglang":
        key, ids = ZLAB_KEY, _nested(cfg, where)
        if ids is None and cfg.get("target_layer_ids") is not None:
            key, ids = "target_layer_ids", _id_list(cfg["target_layer_ids"], "target_layer_ids", where)
        absent = ids is None
        if absent:  # dflash_utils.py: build_target_layer_ids(L, draft layers)
            ids = default_target_layer_ids(L, int(cfg.get("num_hidden_layers") or 1))
            key = f"no ids ({ZLAB_KEY} absent: SGLang's default for {L} layers, z-lab ids {ids})"
        points = points_from_dflash_ids(ids, "sglang", L)
        check_dflash_points(sorted(set(points)), "sglang", L)  # SGLang captures layers.0..L-2.out only
        return key, None if absent else ids, points
    raise EaglewireError(f"--engine {eng.name}: a DFlash config.json is read by vllm, sglang or speculators")


def _fix(trained: list[Point], eng: Engine, L: int, cfg: dict) -> str:
    """The exact key and value that feed `trained` on this engine (or why none can)."""
    if why := dflash_problems(trained, "vllm" if eng.name == "speculators" else eng.name, L):
        return f"{eng.label()} cannot feed the trained points as trained ({'; '.join(why)}): retrain on capturable points"
    conv = "llama.cpp" if eng.name == "llama.cpp" else (
        "speculators" if _speculators_layout(cfg) and eng.name != "sglang" else "zlab")
    ids = dflash_ids_for_points(trained, conv, L)
    if eng.name == "llama.cpp":
        return (f"re-export with `eaglewire export CKPT --format gguf`: it writes {GGUF_KEY} = {ids} "
                "(llama.cpp reads id k as the input of layer k)")
    if conv == "speculators":
        return f'set "{SPEC_KEY}": {ids} at the top level of config.json (speculators/vLLM ids, id k = layers.k-1.out)'
    out = f'set "dflash_config": {{"target_layer_ids": {ids}}} in config.json (z-lab ids, id k = layers.k.out)'
    drop = [k for k in (EAGLE_KEY, "eagle_config", "target_layer_ids") if k in cfg]
    if drop and eng.name in ("vllm", "speculators"):
        out += f" and remove {', '.join(drop)} ({eng.label()} reads {EAGLE_KEY} / eagle_config before dflash_config)"
    return out


def _per_id(ids: list[int] | None, key: str, L: int) -> dict[str, str | None]:
    """What each id means in its key's convention, None where it means nothing capturable (for the JSON)."""
    conv = _CONVENTION.get(key)
    out: dict[str, str | None] = {}
    for i in ids or []:
        try:
            out[str(i)] = points_from_dflash_ids([i], conv, L)[0].name if conv else None
        except EaglewireError:
            out[str(i)] = None
    return out


def doctor_dflash(d: Path, eng: Engine, L: int, trained: list[str] | None, producer=None) -> Report | None:
    """The DFlash report, or None when `d` is not a DFlash drafter (the EAGLE-3 path then reads it)."""
    if eng.name == "llama.cpp":
        path = find_gguf(d)
        meta, shapes = read_gguf_meta(path)
        if meta.get("general.architecture") != "dflash":
            return None
        return _gguf_report(path, meta, shapes, eng, L, trained)
    where, cfg = read_config_json(d)
    if not is_dflash_config(cfg):
        return None
    rep = Report("config")
    rep.data["kind"] = "dflash"
    if trained is None and producer is not None:
        trained = _producer_points(rep, cfg, producer, L, where)
    try:
        key, ids, fed = engine_reads(cfg, eng, L, where)
    except EaglewireError as e:
        key, ids, fed = _read_failed(rep, cfg, eng, L, where, e)
    fix = _verdict(rep, eng, L, key, ids, fed, trained, cfg)
    if eng.name in ("vllm", "speculators"):
        _check_both_keys(rep, cfg, L, where, fix)
    _check_class(rep, eng)
    _check_mask(rep, cfg, Path(d))
    _check_fc(Path(d), cfg, ids if ids is not None else fed, rep)
    return rep


def _check_class(rep: Report, eng: Engine) -> None:
    """vLLM 0.32.0 and llama.cpp capture DFlash's target states as they capture EAGLE-3's: vLLM's DFlash proposer
    sets use_aux_hidden_state_outputs, then `supports_eagle3` or "Model does not support EAGLE3 interface"
    (v1/worker/gpu_model_runner.py); llama.cpp reads `t_layer_inp` for both ("layer input tensor is null",
    src/llama-graph.cpp; `extract_layer_inputs`). SGLang 0.5.23's DFLASH needs the class's own
    `set_dflash_layers_to_capture`, which several EAGLE-3 targets lack (targets/support.py SGLANG_DFLASH_ARCHS)."""
    if refusal := dflash_capture_refusal(eng.name, eng.version, eng.arch):
        rep.add("target class", False, refusal,
                "serve this target with an engine that captures from its class (`eaglewire inspect --target ...` "
                "lists each engine's answer)")


def _read_failed(rep: Report, cfg: dict, eng: Engine, L: int, where: Path, e: EaglewireError):
    """An id the engine cannot capture: a verdict row, not a refusal (the file is the deployment's, not a typo)."""
    if eng.name == "sglang":
        key, ids = ZLAB_KEY, _nested(cfg, where)
        if ids is None:
            key, ids = "target_layer_ids", cfg.get("target_layer_ids")
    else:
        key = SPEC_KEY if _speculators_layout(cfg) else EAGLE_KEY if cfg.get(EAGLE_KEY) else ZLAB_KEY
        ids = _nested(cfg, where) if key == ZLAB_KEY else cfg.get(key)
    rep.add("ids capturable", False, f"{where.name}: {eng.label()} with {L} layers reads {key}: {e}",
            "write ids every engine can capture (embed and final_norm are servable by none)")
    return key, ids, None


def _producer_points(rep: Report, cfg: dict, producer, L: int, where: Path) -> list[str] | None:
    """--trained-with for a DFlash drafter: z-lab, SpecForge and ModelOpt write the ids they trained on into
    dflash_config (z-lab meaning); vLLM/speculators into their own key (k+1)."""
    key = SPEC_KEY if producer.name in ("vllm", "speculators") else ZLAB_KEY
    ids = cfg.get(SPEC_KEY) if key == SPEC_KEY else _nested(cfg, where)
    if ids is None:
        rep.add("training", False, f"{producer.label()} writes the trained ids to {key}, absent here",
                "name the points: --trained-points", level="question")
        return None
    try:
        pts = points_from_dflash_ids(_id_list(ids, key, where), _CONVENTION[key], L)
    except EaglewireError as e:
        rep.add("training", False, f"{producer.label()}: {key} = {ids}: {e}", "check --trained-with")
        return None
    rep.add("training", True, f"{producer.label()}: {key} = {ids}: {[p.name for p in pts]}")
    return [p.name for p in pts]


def _verdict(rep: Report, eng: Engine, L: int, key: str, ids, fed, trained: list[str] | None, cfg: dict
             ) -> str | None:
    """The rows a script reads: what is fed against what was trained, MISWIRED with the fix, or UNKNOWN."""
    fix = _fix([Point.parse(n) for n in trained], eng, L, cfg) if trained else None
    fed_names = [p.name for p in fed] if fed is not None else None
    rep.data.update(engine=eng.label(), key=key, ids=ids, fed=fed_names, trained=trained, fix=fix,
                    id_meanings=_per_id(ids, key, L), engine_reads=f"{key} = {ids}" if ids is not None else key)
    if ids is None and fed is not None:
        rep.add("ids present", False, f"{key}: {eng.label()} feeds its default {fed_names}",
                fix or "write dflash_config.target_layer_ids explicitly", level="warning")
    if not trained:
        rep.data["wiring"] = "UNKNOWN"
        rep.add("points", False, f"{eng.label()} feeds {fed_names} ({key}); the points the drafter was trained on "
                "are unknown", level="question")
        rep.question = "say what it was trained on: --trained-on CKPT or --trained-points NAMES"
        return None
    ok = fed_names == list(trained)
    rep.data["wiring"] = "OK" if ok else "MISWIRED"
    feeds = f"feeds {fed_names}" if fed is not None else "cannot feed them (ids capturable above)"
    rep.add("points", ok, ("" if ok else "MISWIRED: ") + f"{eng.label()} {feeds} ({key} = {ids}); "
            f"trained on {list(trained)}", fix)
    if ok:
        rep.data["fix"] = None  # a script reads `fix` as the change to make
    return fix


def _check_both_keys(rep: Report, cfg: dict, L: int, where: Path, fix: str | None) -> None:
    """vLLM reads the top-level eagle ids first; a file with both is safe only in the relation eagle = z-lab + 1
    (what speculators' update_dflash writes): say which of the two vLLM ignores when they disagree."""
    top, nested = cfg.get(EAGLE_KEY), _nested(cfg, where)
    if top is None or nested is None:
        return
    try:
        same = points_from_dflash_ids(_id_list(top, EAGLE_KEY, where), "vllm", L) == \
            points_from_dflash_ids(nested, "zlab", L)
    except EaglewireError:
        same = False
    rep.add("key relation", same, f"{EAGLE_KEY} = {top} (read first by vLLM, id k = layers.k-1.out) and "
            f"{ZLAB_KEY} = {nested} (SGLang, llama.cpp; id k = layers.k.out) " +
            ("name the same points" if same else "name different points: vLLM and SGLang feed different layers"),
            fix or f"remove {EAGLE_KEY} (vLLM then reads dflash_config +1), or write it as "
            "dflash_config's ids + 1", level="warning")


def _trained_mask(d: Path) -> int | None:
    """The mask token the drafter was trained with: recorded by `eaglewire export`, or in the drafter's own
    DFlash config (the checkpoint's config.json, or that of the checkpoint the export record names)."""
    mask = recorded_field(d, "mask_token_id")
    return mask if mask is not None else (trained_entry(d, DFLASH_KEY) or {}).get("mask_token_id")


def _check_mask(rep: Report, cfg: dict, d: Path) -> None:
    """Every mask slot's input is the mask token's embedding: served with another id than trained, each slot's
    query is a vector the drafter never saw. vLLM reads dflash_config.mask_token_id, then the top-level key
    (`_init_parallel_drafting_params`); SGLang the same order (`parse_dflash_draft_config`)."""
    trained = _trained_mask(d)
    inner = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    served = inner.get("mask_token_id", cfg.get("mask_token_id"))
    if trained is None or served is None:
        return
    key = "dflash_config.mask_token_id" if "mask_token_id" in inner else "mask_token_id"
    rep.add("mask token", served == trained, f"{key} = {served}; the drafter was trained with mask token {trained}",
            f'set "{key.split(".")[-1]}": {trained}' + (" inside dflash_config" if key != "mask_token_id" else ""))


def _check_fc(d: Path, cfg: dict, ids, rep: Report) -> None:
    """vLLM sizes the fc for the ids it reads and only checks the concatenated width: the fc must take
    len(ids) x hidden_size inputs, or the engine refuses (or, same count, serves other layers silently)."""
    files = sorted(d.glob("*.safetensors")) if d.is_dir() else []
    H = cfg.get("hidden_size") or (cfg.get("transformer_layer_config") or {}).get("hidden_size")
    if not files or not ids or not isinstance(H, int):
        return
    for fp in files:
        try:
            with safe_open(str(fp), framework="pt") as f:
                name = next((k for k in f.keys() if k == "fc.weight" or k.endswith(".fc.weight")), None)
                shape = list(f.get_slice(name).get_shape()) if name else None
        except Exception as e:  # noqa: BLE001  damaged weights are a verdict, not a traceback
            rep.add("fc", False, f"{fp.name}: not readable as safetensors ({type(e).__name__})",
                    "re-export the drafter")
            return
        if shape is not None:
            ok = len(shape) == 2 and shape[1] == len(ids) * H
            rep.add("fc", ok, f"fc.weight {shape}: {len(ids)} ids x hidden_size {H} = {len(ids) * H} inputs expected",
                    "the ids and the weights come from different drafters: re-export the checkpoint")
            return


def _gguf_report(path: Path, meta: dict, shapes: dict, eng: Engine, L: int, trained: list[str] | None) -> Report:
    """llama.cpp's converter writes `dflash.target_layers` = z-lab ids + 1 (`conversion/qwen.py`
    `DFlashModel.set_gguf_parameters`); llama-server captures the input of each (`extract_layer_inputs`)."""
    rep = Report("config")
    rep.data.update(kind="dflash", gguf=str(path))
    ids = meta.get(GGUF_KEY)
    fed = None
    if ids is not None:
        ids = _id_list(ids, GGUF_KEY, path)
        try:
            fed = points_from_dflash_ids(ids, "llama.cpp", L)
        except EaglewireError as e:
            rep.add("ids capturable", False, f"{path.name}: {eng.label()} with {L} layers reads {GGUF_KEY}: {e}",
                    "re-export with `eaglewire export CKPT --format gguf`")
    elif trained:
        rep.add("ids present", False, f"{path.name} has no {GGUF_KEY}", _fix([Point.parse(n) for n in trained],
                                                                           eng, L, {}))
    _verdict(rep, eng, L, GGUF_KEY, ids, fed if ids is not None else None, trained, {})
    _check_class(rep, eng)
    return rep
