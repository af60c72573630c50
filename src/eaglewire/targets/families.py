"""Target families: how a checkpoint directory becomes the language model eaglewire captures from.

The targets people serve are rarely a plain ``*ForCausalLM`` directory:
- wrappers (Kimi-K2.5, Qwen3-VL, Gemma-3, Llama-4, Qwen3.5) keep the language
  model one level down, under their own weight names, with its sizes in
  ``text_config``; engines dispatch on the wrapper's class, but every layer id
  counts the language model's decoder layers;
- published checkpoints ship their own code (``auto_map``) for families that
  transformers implements natively (Kimi-K2.5, Kimi-K2 as ``model_type:
  kimi_k2``, DeepSeek-V3): those load through transformers' own classes, and
  the directory's ``.py`` files are never imported;
- some families cannot run transformers' SDPA attention (GPT-OSS's sinks).

Everything downstream sees one shape: a causal LM whose ``config`` is the
language model's config, ``model`` its decoder stack and ``lm_head`` its head.
A wrapper's language model is grafted into transformers' own causal-LM class
for its text config (the class whose forward and ``generate`` the family's
text-only checkpoints use), so capture, generation and verification run the
wrapper's own decoder layers unchanged.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
)
from transformers.models.auto import configuration_auto, modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError

# model_type names published with remote code for architectures transformers implements under another name.
ALIASES = {"kimi_k2": "deepseek_v3"}

# Where a text causal LM's weights sit in each wrapper layout (transformers' own saves and the published
# checkpoints): a text name "model.X" is looked up as each of these prefixes + "X"; "lm_head.X" likewise.
BASE_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "language_model.")
HEAD_PREFIXES = ("lm_head.", "language_model.lm_head.", "model.lm_head.")


def native_model_type(raw: dict) -> str | None:
    """The transformers model type a config.json loads as natively, or None (only its own code knows it).

    A config with an auto_map is native only when every class it names is one transformers implements
    (`KimiK25ForConditionalGeneration` is transformers' `Kimi_K25ForConditionalGeneration`): code that names
    anything else is the checkpoint's own, and stays refused.
    """
    mt = raw.get("model_type")
    mt = ALIASES.get(mt, mt)
    if not (isinstance(mt, str) and mt in CONFIG_MAPPING):
        return None
    auto_map = raw.get("auto_map")
    if auto_map and not all(_norm(c) in _native_class_names() for c in _auto_map_classes(auto_map)):
        return None
    return mt


def _norm(name: str) -> str:
    return name.rsplit(".", 1)[-1].replace("_", "").lower()


def _auto_map_classes(auto_map) -> list[str]:
    if not isinstance(auto_map, dict):
        return ["?"]
    vals = [v for x in auto_map.values() for v in (x if isinstance(x, list) else [x])]
    return [v if isinstance(v, str) else "?" for v in vals if v is not None] or ["?"]


@functools.cache
def _native_class_names() -> frozenset[str]:
    names = set(configuration_auto.CONFIG_MAPPING_NAMES.values())
    for attr in dir(modeling_auto):
        table = getattr(modeling_auto, attr)
        if attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            names.update(v for v in table.values() if isinstance(v, str))
    return frozenset(_norm(n) for n in names)


def _dealiased(raw: dict) -> dict:
    out = {k: v for k, v in raw.items() if k != "auto_map"}
    out["model_type"] = ALIASES.get(out.get("model_type"), out.get("model_type"))
    for key in ("text_config", "language_config", "llm_config"):
        sub = out.get(key)
        if isinstance(sub, dict):
            sub = {k: v for k, v in sub.items() if k != "auto_map"}
            if sub.get("model_type") in ALIASES:
                sub["model_type"] = ALIASES[sub["model_type"]]
            out[key] = sub
    return out


def native_config_from_dict(raw: dict, where: str = "config.json") -> PretrainedConfig:
    """A config dict as transformers' native config class (`native_config` without the file)."""
    mt = native_model_type(raw)
    if mt is None:
        what = "custom code (auto_map) for" if raw.get("auto_map") else "model_type"
        raise EaglewireError(f"{where}: {what} {raw.get('model_type')!r}, which transformers does not implement "
                             "natively; eaglewire never runs model code (use a target transformers supports)")
    try:
        return CONFIG_MAPPING[mt].from_dict(_dealiased(raw))
    except Exception as e:  # noqa: BLE001  per-architecture validation fails anywhere inside transformers
        raise EaglewireError(f"{where}: transformers refuses it as {mt} ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from e


def native_config(path: Path) -> PretrainedConfig:
    """path/config.json as transformers' native config class, its auto_map (custom code) ignored.

    Built from the dict, so transformers never resolves the directory's own
    classes: a checkpoint whose family transformers implements loads with no
    question asked on stdin and no ``.py`` imported.
    """
    p = Path(path) / "config.json"
    return native_config_from_dict(read_json(p, "no config.json (not an HF model directory)"), str(p))


def serving_arch(path: Path) -> str:
    """The class an engine dispatches on: config.json's first architecture as written, else its model_type."""
    raw = read_json(Path(path) / "config.json", "no config.json (not an HF model directory)")
    archs = raw.get("architectures") or []
    return archs[0] if archs and isinstance(archs[0], str) else str(raw.get("model_type"))


def text_config(cfg: PretrainedConfig) -> PretrainedConfig:
    """The language model's config (the config itself for a plain causal LM)."""
    return cfg.get_text_config(decoder=True)


def is_wrapper(cfg: PretrainedConfig) -> bool:
    return text_config(cfg) is not cfg


def model_class(cfg: PretrainedConfig):
    """transformers' class for the whole checkpoint: a wrapper's multimodal class, else the causal LM."""
    if is_wrapper(cfg):
        return AutoModelForImageTextToText._model_mapping[type(cfg)]
    return AutoModelForCausalLM._model_mapping[type(cfg)]


def attention_for(cls, wanted: str | None) -> str | None:
    """`wanted` where the class runs it; transformers' default otherwise (GPT-OSS's sinks have no SDPA)."""
    if wanted == "sdpa" and not getattr(cls, "_supports_sdpa", True):
        return None
    return wanted


def causal_lm_class(text: PretrainedConfig):
    """transformers' causal-LM class for a text config; Llama's for the few text configs that have none
    (Qwen3-VL): its forward only calls the decoder stack and the head, which are the wrapper's own."""
    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(text)]
    except KeyError:
        return LlamaForCausalLM


def language_model(whole: torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside a loaded checkpoint: the model itself, a causal LM the wrapper holds (Llama-4),
    or the wrapper's decoder stack and head grafted into the text config's causal-LM class."""
    cfg = whole.config
    if not is_wrapper(cfg):
        return whole
    inner = whole.get_decoder()
    if inner.get_output_embeddings() is not None and hasattr(inner, "model"):
        return inner  # Llama-4: the wrapper's language model is a whole causal LM
    text = text_config(cfg)
    text._attn_implementation = getattr(inner.config, "_attn_implementation", None) or "eager"
    with torch.device("meta"):  # only the shell is built: its stack and head are replaced below
        lm = _shell(text)
    lm.model = inner
    lm.lm_head = whole.get_output_embeddings()
    lm.config = inner.config
    lm.generation_config = whole.generation_config
    return lm


def _shell(text: PretrainedConfig) -> torch.nn.Module:
    cls = causal_lm_class(text)
    if cls is not LlamaForCausalLM or isinstance(text, LlamaConfig):
        return cls(text)
    return cls(LlamaConfig(num_hidden_layers=0, vocab_size=1, hidden_size=2, intermediate_size=2,
                           num_attention_heads=1))


def build_causal_lm(text: PretrainedConfig) -> torch.nn.Module:
    """A causal LM for a text config, built from its config alone (on the caller's device: meta for a
    skeleton): the family's own class, or the family's decoder stack under the generic shell."""
    lm = _shell(text)
    if causal_lm_class(text) is LlamaForCausalLM and not isinstance(text, LlamaConfig):
        lm.model = MODEL_MAPPING[type(text)](text)
        lm.lm_head = torch.nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        lm.config = text
    return lm


def shard_names(name: str) -> tuple[str, ...]:
    """Where a text causal LM's parameter `name` may sit in a checkpoint's shards, flat first."""
    if name.startswith("model."):
        rest = name[len("model."):]
        return tuple(p + rest for p in BASE_PREFIXES)
    if name.startswith("lm_head."):
        rest = name[len("lm_head."):]
        return tuple(p + rest for p in HEAD_PREFIXES)
    return (name,)


# Families whose states depend on how a sequence is batched: transformers 5.24's DeepSeek-V3.2 indexer picks its
# top-k keys (index_topk) among padded positions under right padding, and among the cache's on a decode step,
# so a sample longer than index_topk gets other features than its own forward (measured 0.06-0.31 relative).
_BATCH_SENSITIVE = {"deepseek_v32": "DeepSeek-V3.2's sparse-attention indexer selects other keys with padding "
                                    "or a cache"}


def batch_sensitive(config) -> str | None:
    """Why this target's features must come from one unpadded, uncached forward per sample (None: they need not)."""
    return _BATCH_SENSITIVE.get(getattr(config, "model_type", None))
