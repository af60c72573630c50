"""`doctor config`: what will this engine feed the drafter, and is it what it was trained on?

Reads a deployment's draft config the way each engine does (which key, which
meaning, which default when absent), converts to physical points, compares
with the training provenance, and prints the exact key and value to set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import safe_open

from eaglewire.doctor.dflash_config import doctor_dflash
from eaglewire.doctor.gguf_config import doctor_config_gguf
from eaglewire.doctor.peagle_config import SPEC_TYPE, check_peagle
from eaglewire.doctor.records import layer_config
from eaglewire.doctor.verdict import Report
from eaglewire.export.gguf import arch_refusal
from eaglewire.infra.errors import EaglewireError, did_you_mean
from eaglewire.saved.checkpoint import corrupt_weights
from eaglewire.saved.formats import NOT_SERVABLE_KEY, read_config_json
from eaglewire.targets.points import (
    Engine,
    Point,
    default_points,
    fed_points,
    ids_for_points,
    point_option,
)
from eaglewire.targets.points import id_meanings as points_id_meanings
from eaglewire.targets.producers import READINGS, Producer, readings, trained_points
from eaglewire.targets.registry import DOCTOR_ENGINES, engine_spec
from eaglewire.targets.support import capture_refusal
from eaglewire.targets.vllm_pp import Stages, describe, pp_option, v2_refusal

ENGINES = DOCTOR_ENGINES  # the engines whose draft configs `doctor config` reads


def _ids(cfg: dict, engine: Engine) -> tuple[list[int] | None, str]:
    """The ids this engine reads, and from which key.

    vLLM 0.32's default runner falls back to the nested key when the top-level one is
    absent; its new GPU runner (eagle3_utils) does not, so only the top level is safe.
    """
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if engine.name == "sglang":
        return nested, "eagle_config.eagle_aux_hidden_state_layer_ids"
    return top, "eagle_aux_hidden_state_layer_ids"


def _is_eagle3(cfg: dict, engine: str) -> tuple[bool, str]:
    arch = " ".join(cfg.get("architectures") or [])
    if cfg.get("speculators_model_type"):
        # a "peagle" drafter is an EAGLE-3 one that vLLM drafts in parallel (doctor/peagle_config.py)
        return cfg["speculators_model_type"] in ("eagle3", SPEC_TYPE), f"speculators_model_type={cfg['speculators_model_type']!r}"
    if "Eagle3" in arch:
        use_aux = (cfg.get("eagle_config") or {}).get("use_aux_hidden_state", True)
        return bool(use_aux), f"architectures={arch!r}, use_aux_hidden_state={use_aux}"
    return False, f"architectures={arch!r}"


def _check_id_list(ids, key: str, path: Path) -> list[int]:
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise EaglewireError(f"{path}: {key} = {ids!r}: expected a list of integer layer ids")
    return ids


def id_meanings(ids: list[int], engine: Engine, L: int, pp: Stages | None = None) -> list[str | None]:
    """What each id captures in ``engine`` (a physical point name), or None where it captures nothing.

    The list is read whole: SGLang >= 0.5.13 decides the +1 for DeepSeek-family targets by the first id.
    """
    return [p.name if p else None for p in points_id_meanings(ids, engine, L, pp=pp)]


def engine_points(cfg: dict, engine: Engine, L: int, path: Path = Path("config.json"), pp: Stages | None = None
                  ) -> tuple[list[Point], str, list[int] | None, list[str | None]]:
    """(points fed, in slot order; how the engine read them; the ids; per-id meaning, None = nothing).
    `pp`: vLLM's pipeline stages, over which some model files feed other points (its default ids too)."""
    ids, key = _ids(cfg, engine)
    if ids is None:
        absent = f"{key} absent: {engine.label()} falls back to its default capture"
        if pp is None:
            return default_points(engine, L), absent, None, []
        return [q for q in fed_points([2, L // 2, L - 3], engine, L, pp=pp) if q], f"{absent} [2, {L // 2}, {L - 3}]", None, []
    ids = _check_id_list(ids, key, path)
    meaning = id_meanings(ids, engine, L, pp)
    fed = [q for q in fed_points(ids, engine, L, pp=pp) if q is not None]
    return fed, f"{key} = {ids}", ids, meaning


def _fix_for(trained: list[Point], engine: Engine, L: int, pp: Stages | None = None) -> str:
    ids = ids_for_points(trained, engine, L, pp=pp)
    key = _ids({}, engine)[1]
    if any(i is None for i in ids):
        over = f" over {pp.label()}" if pp else ""
        return (f"{engine.label()}{over} cannot capture {[p.name for p, i in zip(trained, ids) if i is None]} with any "
                "id list: retrain on capturable points" + (", or serve on fewer stages" if pp else ""))
    if trained != sorted(set(trained)):
        return f"{engine.label()} feeds slots in ascending layer order: retrain with the points in ascending order"
    where = "inside eagle_config" if engine.name == "sglang" else "at the top level of config.json"
    return f'set "{key.split(".")[-1]}": {ids} {where} (ids for {engine.label()}{" over " + pp.label() if pp else ""})'


def _shape(shapes: dict, suffix: str) -> list[int] | None:
    hits = [v for k, v in shapes.items() if k == suffix or k.endswith("." + suffix)]
    return hits[0] if hits else None


def _expected_shapes(cfg: dict) -> dict[str, tuple[str, int, int | None]]:
    """Weight suffix -> (config field it follows, expected dim 0, expected dim 1 or None) from config.json."""
    H, V = cfg.get("hidden_size"), cfg.get("vocab_size")
    Vd = cfg.get("draft_vocab_size") or V
    nh, nkv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    hd = cfg.get("head_dim") or (H // nh if H and nh else None)
    Ht = cfg.get("target_hidden_size") or H
    n_aux = len((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                or cfg.get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
    exp = {
        "fc.weight": ("hidden_size, target_hidden_size x aux ids", H, Ht * n_aux if Ht else None),
        "self_attn.q_proj.weight": ("num_attention_heads x head_dim", nh * hd if nh and hd else None, None),
        "self_attn.k_proj.weight": ("num_key_value_heads x head_dim", nkv * hd if nkv and hd else None, None),
        "mlp.up_proj.weight": ("intermediate_size, hidden_size", cfg.get("intermediate_size"), H),
        "lm_head.weight": ("draft_vocab_size, hidden_size", Vd, H),
        "embed_tokens.weight": ("vocab_size, hidden_size", V, H),
        "d2t": ("draft_vocab_size", Vd, None),
        "t2d": ("vocab_size", V, None),
    }
    return {k: v for k, v in exp.items() if v[1] is not None}


def _check_shapes(cfg: dict, shapes: dict, rep: Report) -> None:
    """Every config.json size the engine builds modules from must agree with the weights it then loads."""
    bad = []
    for suffix, (field, d0, d1) in _expected_shapes(cfg).items():
        got = _shape(shapes, suffix)
        if got is None:
            continue
        if got[0] != d0 or (d1 is not None and len(got) > 1 and got[1] != d1):
            want = f"[{d0}, {d1}]" if d1 is not None else f"[{d0}, ...]"
            bad.append(f"{suffix} is {got}, config.json ({field}) says {want}")
    rep.add("sizes", not bad, "; ".join(bad) or "config.json sizes agree with every weight the engine loads",
            "re-export the drafter so config.json and the weights come from one checkpoint")


# the rows that read the weights: a config-only directory skips them, and says so (row and JSON `skipped`)
WEIGHT_CHECKS = ("tensors", "values", "sizes", "d2t", "fc")


def _check_weights(d: Path, cfg: dict, rep: Report) -> None:
    files = sorted(d.glob("*.safetensors"))
    if not files:
        why = f"no *.safetensors in {d}: config only"
        rep.data["skipped"] = {"checks": list(WEIGHT_CHECKS), "why": why}  # a JSON reader sees the gap too
        rep.add("weights", False, f"{why}, so these checks were skipped: {', '.join(WEIGHT_CHECKS)} (they read the "
                "weights)", "run it on the directory the engine loads (config.json + weights)", level="warning")
        return
    shapes = {}
    for fp in files:
        try:
            with safe_open(str(fp), framework="pt") as f:
                shapes.update({k: list(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception as e:  # noqa: BLE001  a directory, a symlink loop, garbage bytes: a verdict, not a traceback
            rep.add("weights", False, f"{fp.name}: cannot be read as safetensors ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:120]})", "re-export the drafter (config.json + model.safetensors)")
            return
    keys = set(shapes)
    _check_names(keys, rep)
    _check_values(files, rep)
    _check_shapes(cfg, shapes, rep)
    vocab, draft = cfg.get("vocab_size"), cfg.get("draft_vocab_size")
    if draft and vocab and draft < vocab:
        rep.add("d2t", "d2t" in keys, "present" if "d2t" in keys else
                f"draft vocab {draft} < target vocab {vocab} but no d2t tensor: the engine maps draft ids as target ids",
                "export with d2t (offsets: target = draft + d2t[draft])")
    has_fc = any(k.endswith("fc.weight") for k in keys)
    rep.add("fc", has_fc, "fc present (EAGLE-3 feature fusion)" if has_fc else "no fc weight: not an EAGLE-3 head",
            "export the EAGLE-3 checkpoint including fc.weight")


_LAYER = ("input_layernorm", "hidden_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm")
_KNOWN = re.compile(r"^(embed_tokens|lm_head|fc|norm|fc_norm(\.\d+)?|input_norm|(midlayer|layers\.\d+)\.(" +
                    "|".join(re.escape(n) for n in _LAYER) + r"))\.weight$|^(d2t|t2d|mask_hidden)$")


def _check_names(keys: set[str], rep: Report) -> None:
    """Every tensor the EAGLE-3 draft layer needs, and none an engine would not know where to put."""
    first = "midlayer." if any(k.startswith("midlayer.") for k in keys) else "layers.0."
    need = {"fc.weight", "norm.weight", *(f"{first}{n}.weight" for n in _LAYER)}
    missing, extra = sorted(need - keys), sorted(k for k in keys if not _KNOWN.match(k))
    rep.add("tensors", not missing and not extra,
            "every draft-layer tensor present, none unknown" if not (missing or extra) else
            f"missing {missing or 'none'}; unknown {extra[:5] or 'none'}",
            "re-export from the eaglewire checkpoint (an engine loads missing tensors as random values, "
            "or refuses unknown ones)")


def _check_values(files: list[Path], rep: Report) -> None:
    for fp in files:
        with safe_open(str(fp), framework="pt") as f:
            why = corrupt_weights({k: f.get_tensor(k) for k in f.keys()})
        if why:
            rep.add("values", False, f"{fp.name}: {why}", "re-export or retrain: these weights decode garbage or NaN")
            return
    rep.add("values", True, "all weights floating-point and finite")


# Fields the engines read into the draft layer that no weight shape reveals, with the value an engine
# assumes when config.json omits them (transformers' LlamaConfig defaults, which SGLang and vLLM build
# the draft layer's config from; vLLM reads norm_before_residual with default False).
NUMERIC_FIELDS = {"rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                  "norm_before_residual": False}


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-6 * max(abs(a), abs(b))  # float32 round trips of eps and theta
    return a == b


def _serving_value(cfg: dict, key: str) -> tuple[object, bool]:
    """(value the engine uses, whether config.json states it).

    speculators nests the layer's config, but vLLM's update_eagle3 reads norm_before_residual
    from the top level, and reads an absent one as True (unlike a plain EAGLE-3 config).
    """
    if key == "norm_before_residual" and isinstance(cfg.get("transformer_layer_config"), dict):
        return cfg.get(key, True), key in cfg
    layer = layer_config(cfg)
    if key == "rope_theta" and key not in layer and isinstance(layer.get("rope_parameters"), dict):
        params = layer["rope_parameters"]  # transformers 5 layout
        return params.get("rope_theta", NUMERIC_FIELDS[key]), "rope_theta" in params
    return layer.get(key, NUMERIC_FIELDS[key]), key in layer


def check_numerics(cfg: dict, trained_cfg: dict | None, rep: Report) -> None:
    """RoPE base and scaling, norm eps, activation and norm placement as served vs as trained.

    A wrong rope_theta or eps changes every draft logit without any shape error, so
    it shows up only as a low acceptance: the seeds' symptom, from another cause.
    """
    if not trained_cfg:
        rep.add("rope / norm", False, "the drafter's training config is unknown: rope_theta, rope_scaling, "
                "rms_norm_eps and norm placement are not checked", "pass --trained-on CKPT (an eaglewire run); for "
                "another trainer's drafter compare them with its training config", level="warning")
        return
    layer = layer_config(cfg)  # speculators nests the layer's config
    bad: dict[str, str] = {}
    for key, default in NUMERIC_FIELDS.items():
        want, (got, stated) = trained_cfg.get(key, default), _serving_value(cfg, key)
        if not _same(got, want):
            absent = "" if stated else " (absent: the engine default)"
            bad[key] = f"{key} is {got!r}{absent}, trained with {want!r}"
    rep.add("rope / norm", not bad, "; ".join(bad.values()) or "rope_theta, rope_scaling, rms_norm_eps, hidden_act "
            "and norm_before_residual match training", "set " + ", ".join(
                f'"{k}": {json.dumps(trained_cfg.get(k, NUMERIC_FIELDS[k]))}' for k in bad) + " in config.json")
    trained_len, served_len = trained_cfg.get("max_position_embeddings"), layer.get("max_position_embeddings")
    if trained_len and served_len and served_len < trained_len:
        rep.add("max positions", False, f"max_position_embeddings {served_len} < {trained_len} the drafter was built "
                "with: the engine may refuse or truncate long contexts",
                f'set "max_position_embeddings": {trained_len}', level="warning")


def _check_points(rep: Report, cfg: dict, p: Path, engine: Engine, L: int, trained: list[str] | None,
                  pp: Stages | None = None) -> None:
    """The ids rows: capturable, key location, present, and fed == trained."""
    fed, how, ids, meaning = engine_points(cfg, engine, L, p, pp)
    fix = _fix_for([Point.parse(n) for n in trained], engine, L, pp) if trained else None
    if pp is not None:
        refused = v2_refusal(engine.arch, pp)
        rep.add("pipeline parallel", not refused, describe(engine.arch, pp), "serve on one stage (more GPUs per "
                "stage), or VLLM_USE_V2_MODEL_RUNNER=0 with ids for the last stage" if refused else "", level="warning")
    rep.data.update(engine=engine.label(), engine_reads=how, fed=[q.name for q in fed], trained=trained,
                    id_meanings=dict(zip(map(str, ids or []), meaning)), assumed=engine.assumptions())
    if engine.assumptions():
        rep.add("engine", True, f"rules of {engine.label()}: " + "; ".join(engine.assumptions()))
    if ids is not None:
        each = ", ".join(f"{i} -> {m or 'nothing (' + engine.label() + ' cannot capture it with ' + str(L) + ' layers)'}"
                         for i, m in zip(ids, meaning))
        rep.add("ids capturable", None not in meaning, f"{engine.label()} with {L} layers: {each}",
                fix or f"use ids {engine.label()} can capture")
    if engine.name in ("vllm", "speculators"):
        nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if nested is not None and cfg.get("eagle_aux_hidden_state_layer_ids") is None:
            rep.add("key location", False, f"ids {nested} are only under eagle_config: vLLM 0.32's default runner "
                    "falls back to them, its new GPU model runner ignores them and uses its default",
                    fix or "move them to the top level", level="warning")
    if ids is None:
        rep.add("ids present", False, f"no ids for {engine.label()}: it uses its default capture",
                fix or "write the ids explicitly", level="warning")
    if trained:
        ok = [q.name for q in fed] == list(trained)
        rep.add("points", ok, f"{engine.label()} feeds {[q.name for q in fed]} ({how}); trained on {list(trained)}", fix)


def _check_other_versions(rep: Report, cfg: dict, p: Path, engine: Engine, L: int, trained: list[str] | None) -> None:
    """No version given: say where the known versions would feed something else."""
    if engine.version or len(engine.versions()) < 2:
        return
    fed = {}
    for v in engine.versions():
        pts, _how, _ids, _m = engine_points(cfg, v, L, p)
        fed[v.label()] = [q.name for q in pts]
    if len({tuple(f) for f in fed.values()}) < 2:
        return
    each = "; ".join(f"{k} feeds {f}" + (" (= training)" if trained and f == list(trained) else "")
                     for k, f in fed.items())
    rep.add("engine versions", False, f"the known {engine.name} versions read these ids differently: {each}",
            f"name the version you serve with: --engine {engine.name}==VERSION", level="warning")


def _not_servable(rep: Report, cfg: dict, d: Path, engine: Engine) -> bool:
    """An eaglewire checkpoint that claims no engine layout (its config.json says why): nothing else to read.

    Its config deliberately lacks architectures and ids, so the id and size rows would only
    report those absences; the one actionable answer is the export, which writes the engine's
    layout or says why the drafter cannot be expressed in it.
    """
    reasons = cfg.get(NOT_SERVABLE_KEY)
    if reasons is None:
        return False
    why = "; ".join(r for rs in (reasons.values() if isinstance(reasons, dict) else []) for r in rs)
    rep.add("servable", False, f"an eaglewire checkpoint no engine can serve as is ({why or 'reasons not recorded'}): "
            f"{engine.label()} would refuse to load it", f"`eaglewire export {d} --format FMT --out DIR` writes a format's "
            "layout or names what it cannot express (speculators expresses fc_norm, norm_before_residual and any slot "
            "count); else retrain without the options named")
    return True


def user_training(trained_with: str, trained_points_opt: list[str], recorded: list[str] | None, L: int | None,
                  where: Path) -> tuple[list[str] | None, Producer | None]:
    """What the user says of training (--trained-with / --trained-points) beside what the artifact records:
    (trained point names, producer whose reading of config.json gives them). One source, never two."""
    producer = Producer.parse(trained_with) if trained_with else None
    if producer is not None and trained_points_opt:
        raise EaglewireError("--trained-with and --trained-points both given: name what captured the features, "
                             "or the points themselves, not both")
    if producer is not None and producer.name == "eaglewire":
        if recorded is None:
            raise EaglewireError(f"{where}: records no eaglewire training (no eaglewire.json or eaglewire.export.json):"
                                 " pass the run it came from with --trained-on RUN")
        return recorded, None
    if (producer is not None or trained_points_opt) and recorded is not None:
        raise EaglewireError(f"{where}: records the points it was trained on (eaglewire): drop --trained-with / "
                             "--trained-points, or check another directory")
    if trained_points_opt:
        if L is None:
            raise EaglewireError("--trained-points: the target's number of layers is unknown: pass --target or "
                                 "--target-layers")
        return [p.name for p in point_option(trained_points_opt, L, default=False)], None
    return recorded, producer


def _who(producers: list[Producer]) -> list[str]:
    """Labels of a reading's producers; SGLang once where every version reads the ids alike."""
    if sum(p.name == "sglang" for p in producers) > 1:
        return list(dict.fromkeys("SGLang capture" if p.name == "sglang" else p.label() for p in producers))
    return [p.label() for p in producers]


def _ask_rows(rep: Report, cfg: dict, eng: Engine, L: int, groups, versionless: Producer | None,
              pp: Stages | None = None) -> None:
    """One ASK row per reading of the ids: the points it means, and what the engine feeds against them."""
    fed = [q.name for q in engine_points(cfg, eng, L, pp=pp)[0]]
    for names, producers in groups:
        who = ", ".join(_who(producers))
        if names is None:
            rep.add("if trained by", False, f"{who}: could not have captured these ids", level="question")
            continue
        same = names == fed
        rep.add("if trained by", False, f"{who}: trained on {names}; {eng.label()} feeds " + (
            "the same" if same else f"{fed}: {_fix_for([Point.parse(n) for n in names], eng, L, pp)}"),
                level="question")
    rep.data["readings"] = [{"producers": _who(ps), "trained": names} for names, ps in groups]
    example = versionless.versions()[0] if versionless else Producer("specforge", "0.2.0")
    rep.question = ((f"name the {versionless.name} version: --trained-with {example.name}=={example.version}"
                     if versionless else "say what captured the training features: --trained-with PRODUCER==VERSION "
                     "(specforge==0.2.0, sglang==0.5.12, ...) or --trained-points NAMES") +
                    "; the ids mean other layers to each")


def _resolve_training(rep: Report, cfg: dict, eng: Engine, L: int, producer: Producer | None,
                      pp: Stages | None = None) -> list[str] | None:
    """The points training captured, read from config.json in the producer's convention at its version.

    Nothing known: every known producer's reading; when they differ, ASK rows instead of a verdict.
    """
    producers = producer.versions() if producer else list(READINGS)
    groups = readings(cfg, L, eng.arch, producers)
    if producer is not None and len(producers) == 1:
        try:
            pts, how = trained_points(cfg, producers[0], L, eng.arch)
        except EaglewireError as e:
            rep.add("training", False, str(e), "check --trained-with: this drafter cannot come from it as configured")
            return None
        rep.add("training", True, f"{producers[0].label()}: {how}: {[p.name for p in pts]}")
        return [p.name for p in pts]
    if len(groups) == 1 and groups[0][0] is not None:
        who = ", ".join(_who(groups[0][1]))
        rep.add("training", True, f"every reading agrees ({who}): trained on {groups[0][0]}")
        return groups[0][0]
    _ask_rows(rep, cfg, eng, L, groups, producer, pp)
    return None


def doctor_config(d: Path, engine: str | Engine, L: int | None, trained: list[str] | None, trained_sha: str | None,
                  serving_sha: str | None, trained_cfg: dict | None = None, arch: str | None = None,
                  trained_with: Producer | None = None, pp: int = 1) -> Report:
    """`trained` (recorded or given points) wins; else `trained_with` reads config.json in that producer's
    convention; else every known reading, and ASK rows where they differ."""
    eng = Engine.parse(engine, arch)
    if eng.name not in ENGINES:
        raise EaglewireError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)} (optionally ==VERSION)"
                             + did_you_mean(eng.name, ENGINES))
    if L is None:
        raise EaglewireError("the target's number of layers is unknown: pass --target or --target-layers")
    if (stages := pp_option(L, pp, engine_spec(eng.name).runtime or eng.name)) is not None:
        describe(eng.arch, stages)  # a class whose loop over stages is not encoded: refused before anything is read
    if (dflash := doctor_dflash(Path(d), eng, L, trained, trained_with)) is not None:  # other keys, other meanings
        if stages is not None:  # its verdict reads one-stage meanings: never let it pass a split it did not read
            raise EaglewireError(f"--pipeline-parallel-size {pp}: the DFlash check reads the ids as one stage feeds "
                                 "them, and vLLM's DFlash captures through the same per-stage loop; see what the "
                                 f"split feeds with `eaglewire layers IDS --layers-from vllm --pipeline-parallel-size {pp}`")
        return dflash
    if eng.name == "llama.cpp":  # a GGUF: its metadata, not a config.json, holds the ids
        if trained_with is not None:
            raise EaglewireError("--trained-with reads a config.json; for a GGUF name the points: --trained-points")
        rep = doctor_config_gguf(Path(d), eng, L, trained, trained_cfg)
        if refusal := arch_refusal(eng.arch):
            rep.add("target class", False, refusal, "serve this target with an engine that captures from its class "
                    "(`eaglewire inspect --target ...` lists each engine's answer)")
        return rep
    rep = Report("config")
    p, cfg = read_config_json(d)
    if _not_servable(rep, cfg, Path(d), eng):
        return rep
    if refusal := capture_refusal(eng.name, eng.version, eng.arch):
        rep.add("target class", False, refusal, "serve this target with an engine that captures from its class "
                "(`eaglewire inspect --target ...` lists each engine's answer)")
    e3, why = _is_eagle3(cfg, eng.name)
    rep.add("eagle3 head", e3, why, 'serve as EAGLE-3 (architectures ["LlamaForCausalLMEagle3"] / --speculative-algorithm EAGLE3); '
            "as EAGLE-1 the fc over the 3 target features is skipped and tau falls to ~1")
    if trained is None:
        trained = _resolve_training(rep, cfg, eng, L, trained_with, stages)
    _check_points(rep, cfg, p, eng, L, trained, stages)
    _check_other_versions(rep, cfg, p, eng, L, trained)
    _check_weights(Path(d), cfg, rep)
    check_numerics(cfg, trained_cfg, rep)
    check_peagle(rep, cfg, Path(d), eng, trained_cfg)  # mask token, mask_hidden, parallel drafting
    if trained_sha and serving_sha:
        rep.add("chat template", trained_sha == serving_sha,
                f"training data used template {trained_sha}, serving uses {serving_sha}",
                "serve with the chat template the data was generated with (or regenerate the data)")
    return rep
