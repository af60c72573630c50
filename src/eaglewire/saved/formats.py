"""The four serving layouts: what each can express, its config and its tensor names.

Each rule below was read from the engine's own source (see tests/export/
test_engine_rules.py for paths and commits). The point of writing them down in
one place is that an export either produces exactly what the engine loads, or
refuses and says why; a loader that silently drops an unknown key or falls
back to default layer ids is how drafters end up served with random weights
or shifted features.

Format names: ``sglang`` (also SpecForge), ``vllm``, ``speculators``,
``eagle`` (the official SafeAILab/EAGLE repository).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from eaglewire.drafter import DrafterConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import close_path_hint
from eaglewire.targets.points import Engine, Point, eagle3_default, ids_for_points, order_problem

# Keys of an eaglewire checkpoint's config.json beyond the engine's: the drafter's own config
# (what load_checkpoint builds the model from) and, when no engine can serve it as is, why not.
DRAFTER_KEY = "eaglewire_drafter_config"
NOT_SERVABLE_KEY = "not_servable_as_is"

FORMATS = ("sglang", "vllm", "speculators", "eagle")
ALIASES = {"specforge": "sglang", "official": "eagle"}
# Engine meaning of the ids each format stores (points.ENGINES keys).
ID_ENGINE = {"sglang": "sglang", "vllm": "vllm", "speculators": "speculators", "eagle": "eagle"}
ID_KEY = {"sglang": "eagle_config.eagle_aux_hidden_state_layer_ids",
          "vllm": "eagle_aux_hidden_state_layer_ids (top level)",
          "speculators": "eagle_aux_hidden_state_layer_ids (top level)",
          "eagle": "none (hard-coded HF [2, L//2, L-3])"}


def canonical(fmt: str) -> str:
    f = ALIASES.get(fmt, fmt)
    if f not in FORMATS:
        raise EaglewireError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)} (or specforge, official)")
    return f


# --- what a format can express --------------------------------------------------


def refusals(fmt: str, cfg: DrafterConfig, points: list[Point], num_layers: int,
             engine: Engine | None = None) -> list[str]:
    """Reasons the drafter cannot be written in `fmt` (empty = it can).

    `engine` names the serving version and target architecture when known (SGLang's
    meaning of an id list depends on both); default: the format's engine, newest verified.
    """
    why: list[str] = []
    eng = engine or Engine.parse(ID_ENGINE[fmt])
    ids = ids_for_points(points, eng, num_layers) if fmt != "eagle" else None
    if ids is not None:
        bad = [p.name for p, i in zip(points, ids) if i is None]
        if bad:
            why.append(f"{eng.label()} has no layer id for {', '.join(bad)} (it cannot capture that tensor, or no id "
                       "list reads as these points), but the drafter was trained on it")
        if order := order_problem(points, eng):
            why.append(order)
    if fmt in ("sglang", "vllm", "eagle") and cfg.num_aux != 3:
        why.append(f"{fmt}'s fc is hard-coded to 3 x target_hidden_size inputs; the drafter has {cfg.num_aux} feature slots")
    if fmt in ("sglang", "eagle") and cfg.fc_norm:
        why.append(f"{fmt} has no fc_norm (per-slot RMSNorm before fc); the drafter was trained with one "
                   "(vLLM 0.32 and speculators read it)")
    for flag, what in (("norm_before_fc", "one RMSNorm over the fc input"),
                       ("norm_output", "the normed hidden fed back to the next draft step")):
        if fmt in ("sglang", "eagle") and getattr(cfg, flag):
            why.append(f"{fmt} has no {flag} ({what}); the drafter was trained with it (vLLM and speculators read it)")
    if fmt in ("sglang", "eagle") and cfg.norm_before_residual:
        why.append(f"{fmt}'s first layer takes the raw hidden state as residual; the drafter was trained with norm_before_residual")
    if fmt in ("sglang", "eagle") and cfg.num_layers != 1:
        why.append(f"{fmt} export supports one decoder layer (midlayer); the drafter has {cfg.num_layers} "
                   "(SGLang names extra layers additional_layers.* with hidden_norm instead of input_layernorm, version-dependent)")
    if fmt == "speculators" and cfg.target_hidden_size != cfg.hidden_size:
        why.append("speculators sizes fc as num_aux x hidden_size; the drafter's target_hidden_size "
                   f"{cfg.target_hidden_size} differs from its hidden_size {cfg.hidden_size}")
    if fmt == "eagle":
        want = eagle3_default(num_layers)
        if list(points) != want:
            why.append("the official EAGLE code hard-codes HF indices [2, L//2, L-3] = "
                       f"{[p.name for p in want]} and stores no ids; the drafter was trained on {[p.name for p in points]}: "
                       f"{_eagle_fix(cfg, points, num_layers, want)}")
        if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
            why.append("the official EAGLE attention uses head_dim = hidden_size // num_heads; "
                       f"the drafter has head_dim {cfg.head_dim} x {cfg.num_attention_heads} heads != {cfg.hidden_size}")
    return why


def _eagle_fix(cfg: DrafterConfig, points: list[Point], num_layers: int, want: list[Point]) -> str:
    """What to do instead, since the points are fixed at capture: recapture on the official ones, or a format
    that stores its ids and can write this drafter (checked, so the advice never leads to another refusal)."""
    others = [f for f in FORMATS if f != "eagle" and not refusals(f, cfg, points, num_layers)]
    return (f"rebuild the data with `eaglewire data build --points {','.join(p.name for p in want)}` (or train "
            f"--online with those --points) and retrain, or export with "
            + (" / ".join(f"--format {f}" for f in others) + " (they store the ids)" if others
               else "another format once the drafter fits one"))


def serving_engine(fmt: str, version: str, arch: str | None) -> Engine:
    """The engine the ids are written for: the format's, at `version` (empty: newest verified), on `arch`'s family."""
    name = ID_ENGINE[fmt]
    return Engine.parse(f"{name}=={version}" if version else name, arch)


def format_ids(fmt: str, cfg: DrafterConfig, points: list[Point], num_layers: int,
               engine: Engine) -> tuple[list[int] | None, list[str]]:
    """(ids in `fmt`'s meaning, reasons it cannot be written): one computation for export and checkpoints.

    Ids are None when refused (a None id must never reach a config) and for `eagle`, which stores none.
    """
    why = refusals(fmt, cfg, points, num_layers, engine)
    if why or fmt == "eagle":
        return None, why
    return [int(i) for i in ids_for_points(points, engine, num_layers)], why


# --- configs -------------------------------------------------------------------


def checkpoint_config(cfg: DrafterConfig, points: list[Point], num_layers: int, arch: str | None) -> dict:
    """A training checkpoint's config.json: exactly `export --format sglang`'s, or no engine claim at all.

    The checkpoint doubles as an SGLang/SpecForge layout, so it must say no more than the
    export would: when SGLang cannot serve the drafter as trained (fc_norm, norm_before_residual,
    other than 3 slots, an uncapturable point), it gets neither architectures nor model_type, so
    an engine refuses to load it instead of serving it with wrong features, and the reasons say why.
    `arch` is the target's model_type as recorded (SGLang reads ids differently on DeepSeek-family targets).
    """
    ids, why = format_ids("sglang", cfg, points, num_layers, serving_engine("sglang", "", arch))
    if why:
        return {NOT_SERVABLE_KEY: {"sglang": why}, DRAFTER_KEY: cfg.to_dict()}
    return {**build_config("sglang", cfg, ids), DRAFTER_KEY: cfg.to_dict()}


def _rope(cfg: DrafterConfig) -> dict:
    """Both spellings: rope_theta/rope_scaling (engines on transformers 4) and rope_parameters (5)."""
    params = {"rope_type": "default"}
    if cfg.rope_scaling:
        params = dict(cfg.rope_scaling)
        params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = cfg.rope_theta
    d = {"rope_theta": cfg.rope_theta, "rope_parameters": params}
    if cfg.rope_scaling:
        d["rope_scaling"] = dict(cfg.rope_scaling)
    return d


def llama_fields(cfg: DrafterConfig) -> dict:
    """The LlamaConfig fields of the draft decoder, all explicit (no reader default is relied on)."""
    return {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": "float32", **_rope(cfg),
    }


def build_config(fmt: str, cfg: DrafterConfig, ids: list[int] | None, verifier: dict | None = None,
                 speculative_tokens: int = 3) -> dict:
    """config.json for `fmt`; `ids` are already in the format's meaning."""
    base = {**llama_fields(cfg), "draft_vocab_size": cfg.draft_vocab_size}
    if fmt == "sglang":
        return {"architectures": ["LlamaForCausalLMEagle3"], **base, "target_hidden_size": cfg.target_hidden_size,
                "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids}}
    if fmt == "vllm":
        # vLLM reads only the top-level key (the nested one is ignored), and its
        # norm_before_residual default is False here but True for speculators configs.
        return {"architectures": ["LlamaForCausalLMEagle3"], **base, "target_hidden_size": cfg.target_hidden_size,
                "eagle_aux_hidden_state_layer_ids": ids, "norm_before_residual": cfg.norm_before_residual,
                **{k: True for k in ("norm_before_fc", "fc_norm", "norm_output") if getattr(cfg, k)},  # getattr(config, k)
                "eagle_config": {"use_aux_hidden_state": True}}
    if fmt == "eagle":
        d = {"architectures": ["LlamaForCausalLMEagle3"], **base, "bias": False}
        if cfg.target_hidden_size != cfg.hidden_size:  # official code: present => embedding read from this checkpoint
            d["target_hidden_size"] = cfg.target_hidden_size
        return d
    return speculators_config(cfg, ids, verifier, speculative_tokens)


def speculators_config(cfg: DrafterConfig, ids: list[int] | None, verifier: dict | None, speculative_tokens: int) -> dict:
    """speculators 0.9.0 Eagle3SpeculatorConfig (models/eagle3/config.py, config.py)."""
    tl = llama_fields(cfg)
    tl.pop("torch_dtype")
    tl["tie_word_embeddings"] = False  # speculators always has its own lm_head tensor
    tl["pad_token_id"] = None
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
        "transformer_layer_config": tl, "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual, "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": ids, "norm_before_fc": cfg.norm_before_fc, "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output, "embed_requires_grad": False, "torch_dtype": "float32",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": verifier or {"name_or_path": None, "architectures": []},
        },
    }


# --- tensor names --------------------------------------------------------------

_FC_NORM_SLOT = re.compile(r"^fc_norm\.(\d+)\.weight$")


def _first_prefix(cfg: DrafterConfig) -> str:
    return "midlayer." if cfg.num_layers == 1 else "layers.0."


def to_format_state(fmt: str, cfg: DrafterConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """eaglewire state dict -> the names `fmt` loads (cloned: tied weights must not share storage)."""
    out = {}
    for k, v in sd.items():
        v = v.detach().to("cpu").clone().contiguous()
        if fmt in ("vllm", "speculators") and k.startswith("midlayer."):
            k = "layers.0." + k[len("midlayer."):]
        if fmt in ("vllm", "speculators") and k == "fc_norm.weight":  # both load an nn.ModuleList of slot norms
            for i, chunk in enumerate(v.chunk(cfg.num_aux)):
                out[f"fc_norm.{i}.weight"] = chunk.clone()
            continue
        if fmt in ("vllm", "speculators") and k in ("d2t", "t2d") and cfg.draft_vocab_size == cfg.vocab_size:
            # a full draft vocabulary is the identity (data/vocab.py): neither registers d2t/t2d for it, and vLLM
            # 0.32 refuses to start on the unexpected key ("no module or parameter named 'draft_id_to_target_id'")
            continue
        out[k] = v
    return out


def from_format_state(cfg: DrafterConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any format's names -> eaglewire names (unknown names pass through, for check_state to report)."""
    first = _first_prefix(cfg)
    out: dict[str, torch.Tensor] = {}
    slots: dict[int, torch.Tensor] = {}
    for k, v in sd.items():
        m = _FC_NORM_SLOT.match(k)
        if m:
            slots[int(m.group(1))] = v
            continue
        for pre in ("midlayer.", "layers.0."):
            if k.startswith(pre):
                k = first + k[len(pre):]
                break
        out[k] = v
    if slots:
        if sorted(slots) != list(range(len(slots))):
            raise EaglewireError(f"fc_norm.<i>.weight slots {sorted(slots)} are not 0..{len(slots) - 1}")
        out["fc_norm.weight"] = torch.cat([slots[i] for i in range(len(slots))])
    return out


# --- reading a deployed config ---------------------------------------------------


def read_config_json(d: Path) -> tuple[Path, dict]:
    p = Path(d) / "config.json"
    if not Path(d).exists():
        raise EaglewireError(f"{d}: does not exist (expected a draft model directory){close_path_hint(Path(d))}")
    if not p.is_file():
        raise EaglewireError(f"{d}: no config.json (expected a draft model directory)")
    try:
        cfg = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise EaglewireError(f"{p}: not valid JSON ({e}); expected the draft model's config.json") from e
    if not isinstance(cfg, dict):
        raise EaglewireError(f"{p}: expected a JSON object, got {type(cfg).__name__}")
    return p, cfg
