"""A target's config.json, checked before transformers builds anything from it.

transformers allocates what a config says (10^30 layers is a hang, a 10^12
vocabulary a crash) and reports a malformed field deep inside its own code. The
geometry here bounds every size and names the field in one line; `plan` sizes
a target from the same fields, and `load_target` checks them before loading.
"""

from __future__ import annotations

import math
from pathlib import Path

from transformers import AutoConfig

import eaglewire.targets.families as families
from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError

# Upper bounds of a config's sizes, checked before anything is allocated (the drafter's config uses the same):
# 10^7 layers or a 10^12 vocabulary in a config.json would grow memory to GB.
MAX_HIDDEN = 10**6  # hidden_size, head_dim, target_hidden_size
MAX_WIDTH = 10**7  # intermediate_size, vocab_size, draft_vocab_size
EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
MAX_LAYERS = 10_000


def text_config(raw: dict) -> dict:
    """Multimodal configs nest the language model's fields."""
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(raw.get(key), dict) and "hidden_size" in raw[key]:
            return {**raw[key], "model_type": raw[key].get("model_type", raw.get("model_type"))}
    return raw


class Fields:
    """Reads config fields and remembers which ones it used, so the output can say so."""

    def __init__(self, raw: dict, where: str):
        self.raw, self.where, self.used = raw, where, []

    def get(self, *names: str, default=None, required: bool = False):
        for n in names:
            if self.raw.get(n) is not None:
                self.used.append(n)
                return self.raw[n]
        if required:
            raise EaglewireError(f"{self.where}: field {names[0]} missing (needed to size the target)")
        return default

    def count(self, *names: str, default=None, required: bool = False, lo: int = 1, hi: int = MAX_WIDTH) -> int:
        """An integer field in [lo, hi]: "abc", NaN, Infinity, 0 heads or 10^7 layers are refused in one line
        (a meta-device model of 10^7 layers would grow memory without bound)."""
        v = self.get(*names, default=default, required=required)
        ok = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and math.isfinite(v) and v == int(v)
        if not ok or not lo <= int(v) <= hi:
            name = next((n for n in names if n in self.raw), names[0])
            raise EaglewireError(f"{self.where}: field {name} = {v!r}: expected an integer in [{lo}, {hi}]")
        return int(v)


def geometry(f: Fields) -> dict:
    """The sizes every stage reads, each an integer in a range that bounds allocation (not one that judges the
    architecture: a tiny test target may have kv_lora_rank above its hidden size)."""
    H = f.count("hidden_size", "d_model", "n_embd", required=True, hi=MAX_HIDDEN)
    heads = f.count("num_attention_heads", "n_head", required=True, hi=MAX_HIDDEN)
    g = {"num_layers": f.count("num_hidden_layers", "n_layer", "num_layers", required=True, hi=MAX_LAYERS), "hidden_size": H,
         "num_heads": heads, "num_kv_heads": f.count("num_key_value_heads", default=heads, hi=heads),
         "head_dim": f.count("head_dim", default=max(H // heads, 1), hi=MAX_HIDDEN), "vocab_size": f.count("vocab_size", required=True),
         "intermediate_size": f.count("intermediate_size", "ffn_dim", default=4 * H),
         "tie_word_embeddings": bool(f.get("tie_word_embeddings", default=False)),
         "num_experts": f.count(*EXPERT_KEYS, default=0, lo=0, hi=100_000)}
    g["experts_per_token"] = (f.count("num_experts_per_tok", "moe_topk", default=2, hi=g["num_experts"])
                              if g["num_experts"] else 0)
    if f.raw.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3): the cache holds the latent and the rope key only
        rope = f.count("qk_rope_head_dim", required=True, hi=MAX_HIDDEN)
        g["kv_values_per_token_per_layer"] = f.count("kv_lora_rank", hi=MAX_HIDDEN) + rope
        # attention scores run over nope+rope dims and values over v_head_dim (192 and 128 on DeepSeek-V3 and
        # Kimi-K2.5), not over hidden/heads (112): what prefill FLOPs count
        g["qk_head_dim"] = f.count("qk_nope_head_dim", required=True, hi=MAX_HIDDEN) + rope
        g["v_head_dim"] = f.count("v_head_dim", required=True, hi=MAX_HIDDEN)
    else:
        g["kv_values_per_token_per_layer"] = 2 * g["num_kv_heads"] * g["head_dim"]
        g["qk_head_dim"] = g["v_head_dim"] = g["head_dim"]
    return g


def check_target_config(d: Path) -> dict:
    """d/config.json as a JSON object whose sizes are integers in range: one line naming the field otherwise."""
    p = Path(d) / "config.json"
    raw = read_json(p, "no config.json (not an HF model directory)")
    if not isinstance(raw, dict):
        raise EaglewireError(f"{p}: expected a JSON object (an HF config.json), got {type(raw).__name__}")
    mt = text_config(raw).get("model_type")
    if not isinstance(mt, str) or not mt:
        raise EaglewireError(f"{p}: field model_type = {mt!r}: expected the architecture's name (a string)")
    arch = raw.get("architectures")
    if arch is not None and (not isinstance(arch, list) or not all(isinstance(a, str) for a in arch)):
        raise EaglewireError(f"{p}: field architectures = {str(arch)[:40]}: expected a list of class names")
    geometry(Fields(text_config(raw), str(p)))
    if families.native_model_type(raw) is not None:  # built from the dict: an auto_map is never resolved
        families.native_config(Path(d))
        return raw
    try:  # what only transformers' own validation knows (rope parameters, per-architecture fields)
        AutoConfig.from_pretrained(Path(d), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001  its errors come from anywhere inside it
        raise EaglewireError(f"{p}: transformers refuses it ({type(e).__name__}: {_first_line(e)})") from e
    return raw


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:200]


def check_tokenizer_config(d: Path) -> None:
    """d/tokenizer_config.json, when there is one, as a JSON object (transformers' errors on others are deep)."""
    p = Path(d) / "tokenizer_config.json"
    if p.is_file():
        raw = read_json(p, "no tokenizer_config.json")
        if not isinstance(raw, dict):
            raise EaglewireError(f"{p}: expected a JSON object, got {type(raw).__name__}")
        for key, why in _TOKENIZER_FIELDS.items():
            if key in raw and not _TOKENIZER_OK[why](raw[key]):
                raise EaglewireError(f"{p}: field {key} = {str(raw[key])[:40]}: expected {why}")


def _token(v) -> bool:  # a special token as transformers writes it: the text, or an AddedToken object
    return v is None or isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("content"), str))


_TOKENIZER_OK = {"a token (a string or an object with its content)": _token,
                 "a string": lambda v: v is None or isinstance(v, str),
                 "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                 "a template (a string or a list of named templates)": lambda v: v is None or isinstance(v, (str, list)),
                 "an object": lambda v: isinstance(v, dict)}
_TOKENIZER_FIELDS = {
    **{k: "a token (a string or an object with its content)"
       for k in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")},
    "tokenizer_class": "a string", "backend": "a string", "model_max_length": "a number",
    "chat_template": "a template (a string or a list of named templates)", "added_tokens_decoder": "an object"}
