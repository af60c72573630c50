"""DFlash drafters in each engine's layout: what an export writes, what an import reads.

Two layouts exist (docs/parallel-drafters.md §1, "The config.json each one writes"):

* z-lab (what SGLang, vLLM and llama.cpp's converter load): a Qwen3 config with
  `architectures: ["DFlashDraftModel"]` and `dflash_config.target_layer_ids` in
  z-lab numbering (id k = `layers.{k}.out`). Written with that key ONLY: vLLM
  0.32 reads a top-level `eagle_aux_hidden_state_layer_ids` first and as is, so
  a second key is how the two numberings collide (§2, vLLM pitfalls).
* speculators 0.9.0 (`models/dflash/config.py`): `speculators_model_type: "dflash"`,
  a `transformer_layer_config`, `aux_hidden_state_layer_ids` in vLLM numbering
  (k + 1). vLLM turns it into the z-lab keys (`update_dflash`, algos.py).

Both carry the same tensor names (`DFlashDrafter.state_dict()`; speculators'
`DFlashDraftModel` names its modules alike and registers no d2t/t2d for a
full vocabulary). The official EAGLE repository has no DFlash: refused.
"""

from __future__ import annotations

from eaglewire.drafter.dflash import DFlashConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import zlab_config
from eaglewire.targets.dflash_ids import (
    CONVENTIONS,
    convention,
    dflash_ids_for_points,
    dflash_problems,
    points_from_dflash_ids,
)
from eaglewire.targets.points import Point

FORMATS = ("vllm", "sglang", "speculators", "gguf")
REFUSED = {"eagle": "the official EAGLE repository (SafeAILab/EAGLE) has no DFlash drafter: export --format vllm, "
                    "sglang, speculators or gguf"}
_ALIASES = {"specforge": "sglang", "zlab": "sglang", "z-lab": "sglang", "llama.cpp": "gguf"}
# the engine that serves each format (its reach bounds the points), the convention of its ids and their key
ENGINE = {"vllm": "vllm", "sglang": "sglang", "speculators": "vllm", "gguf": "llama.cpp"}
# (gguf: the staged directory holds z-lab ids, llama.cpp's converter writes them + 1: the llama.cpp numbering)
CONVENTION = {"vllm": "zlab", "sglang": "zlab", "speculators": "vllm", "gguf": "llama.cpp"}
ID_KEY = {"vllm": "dflash_config.target_layer_ids", "sglang": "dflash_config.target_layer_ids",
          "speculators": "aux_hidden_state_layer_ids",
          "gguf": "dflash.target_layers (GGUF, written by llama.cpp's converter as dflash_config.target_layer_ids + 1)"}
SPECULATORS_VERSION = "0.9.0"
LABEL = {"zlab": "z-lab", "vllm": "speculators/vLLM", "llama.cpp": "llama.cpp"}


def canonical(fmt: str) -> str:
    f = str(fmt).strip().lower()
    f = _ALIASES.get(f, f)
    if f in REFUSED:
        raise EaglewireError(f"--format {fmt}: {REFUSED[f]}")
    if f not in FORMATS:
        raise EaglewireError(f"--format {fmt!r} for a DFlash drafter: expected one of {', '.join(FORMATS)}")
    return f


def problems(fmt: str, points: list[Point], num_layers: int) -> list[str]:
    return dflash_problems(points, ENGINE[fmt], num_layers)


def check_exportable(fmt: str, points: list[Point], num_layers: int, where: str) -> None:
    """One line: why `fmt`'s engine cannot serve these points, and which formats' engines would."""
    why = problems(fmt, points, num_layers)
    if not why:
        return
    takers = [f for f in FORMATS if not problems(f, points, num_layers)]
    alt = f"--format {' or '.join(takers)} would serve it" if takers else "no format's engine can serve these points"
    raise EaglewireError(f"{where}: cannot export to {fmt}: " + "; ".join(why) + f" ({alt})")


def ids_label(ids: list[int], conv: str, points: list[Point]) -> str:
    """'z-lab ids [1, 14, 28] = layers.1/14/28.out': the numbering named with the points it means."""
    if all(p.kind == "layer" for p in points):
        short = "layers." + "/".join(str(p.layer) for p in points) + ".out"
    else:
        short = ", ".join(p.name for p in points)
    return f"{LABEL[conv]} ids {ids} = {short}"


def export_config(fmt: str, cfg: DFlashConfig, num_layers: int, verifier: dict | None = None) -> tuple[dict, list[int]]:
    """(config.json, the ids written) of `fmt` for a drafter whose points are `cfg.points`."""
    ids = [int(i) for i in dflash_ids_for_points(cfg.points, CONVENTION[fmt], num_layers)]
    if fmt == "speculators":
        return speculators_config(cfg, ids, verifier), ids
    return zlab_config(cfg, num_layers), ids  # cfg's ids are the z-lab ones (gguf: staged for the converter)


def speculators_config(cfg: DFlashConfig, aux_ids: list[int], verifier: dict | None) -> dict:
    """speculators 0.9.0 `DFlashSpeculatorConfig` (models/dflash/config.py).

    `sliding_window_non_causal: true`: vLLM's `update_dflash` writes `dflash_config.causal = not
    sliding_window_non_causal`, and a `causal` there overrides every layer (qwen3_dflash.py
    `_resolve_layer_attention`); speculators' default false would serve the bidirectional block causally."""
    tl = {k: v for k, v in zlab_config(cfg, 0).items()
          if k not in ("architectures", "block_size", "num_target_layers", "dflash_config")}
    return {
        "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION, "transformer_layer_config": tl,
        "draft_vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "target_hidden_size": cfg.hidden_size,
        "aux_hidden_state_layer_ids": aux_ids, "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": True, "sample_from_anchor": False, "torch_dtype": "float32",
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": verifier or {"name_or_path": None, "architectures": []},
        },
    }


# --- reading a foreign DFlash config.json ---------------------------------------------------------


def is_dflash(raw: dict) -> bool:
    return (raw.get("speculators_model_type") in ("dflash",) or isinstance(raw.get("dflash_config"), dict)
            or any(str(a).startswith("DFlash") for a in raw.get("architectures") or []))


def stored_ids(raw: dict, where: str) -> tuple[str, list[int], str, str]:
    """(layout, ids as stored, their convention, the key) of a DFlash config.json; refuses ambiguity."""
    if raw.get("speculators_model_type") == "dflash":
        ids = raw.get("aux_hidden_state_layer_ids")
        if not _int_list(ids):
            raise EaglewireError(f"{where}: aux_hidden_state_layer_ids = {str(ids)[:40]}: expected a list of integers "
                                 "(speculators/vLLM numbering; speculators' default needs the verifier)")
        return "speculators", list(ids), "vllm", "aux_hidden_state_layer_ids"
    dc = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    ids, key = dc.get("target_layer_ids"), "dflash_config.target_layer_ids"
    if ids is None and raw.get("target_layer_ids") is not None:
        ids, key = raw["target_layer_ids"], "target_layer_ids"  # SGLang and llama.cpp's fallback
    if not _int_list(ids):
        raise EaglewireError(f"{where}: {key} = {str(ids)[:40]}: expected a list of integers (z-lab numbering, "
                             "id k = layers.{k}.out)")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top is not None and top != [i + 1 for i in ids]:
        raise EaglewireError(f"{where}: eagle_aux_hidden_state_layer_ids = {top} (what vLLM reads first, as is) but "
                             f"{key} = {ids} (z-lab, +1 for vLLM): the two numberings disagree; keep one key")
    if isinstance(raw.get("eagle_config"), dict):
        raise EaglewireError(f"{where}: an eagle_config object in a DFlash config: vLLM 0.32 then reads its "
                             "eagle_aux_hidden_state_layer_ids instead of dflash_config (absent: the target's default); "
                             "remove it")
    return "zlab", list(ids), "zlab", key


def _int_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)


def _get(raw: dict, key: str, *more: dict):
    for d in (raw, *more):
        if isinstance(d, dict) and d.get(key) is not None:
            return d[key]
    return None


def drafter_config(raw: dict, layout: str, zlab_ids: list[int], where: str) -> DFlashConfig:
    """The DFlashConfig a foreign config.json describes (Qwen3 fields; DFlash keys where each layout keeps them)."""
    q = raw.get("transformer_layer_config") if layout == "speculators" else raw
    if not isinstance(q, dict):
        raise EaglewireError(f"{where}: transformer_layer_config = {str(q)[:40]}: expected an object (Qwen3 fields)")
    dc = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if q.get(k) is None]
    mask = _get(dc, "mask_token_id", raw)
    block = _get(dc, "block_size", raw)
    missing += [k for k, v in (("mask_token_id", mask), ("block_size", block)) if v is None]
    if missing:
        raise EaglewireError(f"{where}: {', '.join(missing)} missing (expected a DFlash drafter's config.json)")
    heads = q["num_attention_heads"]
    rope = (q.get("rope_parameters") or {}).get("rope_theta") if isinstance(q.get("rope_parameters"), dict) else None
    try:
        return DFlashConfig(
            hidden_size=q["hidden_size"], intermediate_size=q["intermediate_size"], num_layers=q["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=q.get("num_key_value_heads") or heads,
            head_dim=q.get("head_dim") or q["hidden_size"] // heads, vocab_size=q["vocab_size"],
            target_layer_ids=tuple(zlab_ids), mask_token_id=mask, block_size=block,
            rms_norm_eps=float(q.get("rms_norm_eps", 1e-6)), rope_theta=float(rope or q.get("rope_theta", 1e6)),
            max_position_embeddings=q.get("max_position_embeddings", 40960))
    except (ValueError, TypeError) as e:
        raise EaglewireError(f"{where}: {e}") from e


def read_points(raw: dict, num_layers: int, where: str, layers_from: str = "") -> dict:
    """What a foreign DFlash config.json wires: layout, key, ids, their convention, points and z-lab ids."""
    layout, ids, conv, key = stored_ids(raw, where)
    if layers_from:
        conv = convention(layers_from)
    try:
        pts = points_from_dflash_ids(ids, conv, num_layers)
    except EaglewireError as e:
        raise EaglewireError(f"{where}: {key} = {ids}: {e}") from e
    return {"layout": layout, "ids_key": key, "ids_found": ids, "convention": conv,
            "convention_meaning": CONVENTIONS[conv][1], "points": pts,
            "zlab_ids": [int(i) for i in dflash_ids_for_points(pts, "zlab", num_layers)],
            "ids_read": ids_label(ids, conv, pts)}
