"""Configuration of an EAGLE-3 draft model.

The drafter is deliberately described by a plain dataclass rather than a
transformers ``PretrainedConfig``: it is small, round-trips through JSON
without surprises, and ``from_dict`` can refuse unknown keys (a silently
ignored key is how a wrongly-wired checkpoint goes unnoticed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from eaglewire.targets.hfconfig import MAX_HIDDEN, MAX_WIDTH

_DEFAULT_ROPE_THETA = 10000.0

# The drafter's sizes are bounded before anything is allocated, as a target's are (MAX_HIDDEN, MAX_WIDTH from
# targets.hfconfig): 10^7 layers or a 10^12 vocabulary in a config.json would grow memory to GB.
MAX_DRAFTER_LAYERS = 64  # EAGLE-3 drafters have 1; a few released ones 2-4
MAX_POSITIONS = 10**9
BOUNDS = {"hidden_size": MAX_HIDDEN, "intermediate_size": MAX_WIDTH, "num_attention_heads": MAX_HIDDEN,
          "num_key_value_heads": MAX_HIDDEN, "head_dim": MAX_HIDDEN, "max_position_embeddings": MAX_POSITIONS,
          "target_hidden_size": MAX_HIDDEN, "vocab_size": MAX_WIDTH, "draft_vocab_size": MAX_WIDTH, "num_aux": 64,
          "num_layers": MAX_DRAFTER_LAYERS}


def bounded_count(name: str, v: Any, hi: int, lo: int = 1) -> int:
    """`v` as an integer in [lo, hi], or a ValueError naming `name` ("abc", NaN, 1e400, True, 10^12 refused)."""
    ok = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v) and v == int(v))
    if not ok or not lo <= int(v) <= hi:
        raise ValueError(f"field {name} = {v!r}: expected an integer in [{lo}, {hi}]")
    return int(v)


@dataclass
class DrafterConfig:
    """Shape and behaviour of an :class:`~eaglewire.drafter.model.Eagle3Drafter`.

    Fields mirror the official EAGLE-3 draft config (Llama-style names) plus the
    EAGLE-specific ones:

    * ``target_hidden_size`` / ``num_aux``: the fc input is the concatenation of
      ``num_aux`` captured target tensors, width ``num_aux * target_hidden_size``.
    * ``vocab_size`` is the *target* vocabulary (the frozen embedding);
      ``draft_vocab_size`` the lm_head output (mapped back through ``d2t``).
    * ``norm_before_residual``: the first layer's residual is the
      ``hidden_norm``-ed hidden state instead of the raw one (some released
      checkpoints were trained that way).
    * ``fc_norm``: a *per-slot* RMSNorm on the fc input. Each of the
      ``num_aux`` captured tensors is normalised on its own (they come from
      different depths and their scales differ by orders of magnitude), with a
      learned weight of width ``num_aux * target_hidden_size`` stored as
      ``fc_norm.weight``. Off by default (the official layout has none).
    * ``norm_before_fc``: one RMSNorm over the whole fc input (all slots
      together, weight ``input_norm.weight`` of width ``num_aux *
      target_hidden_size``), speculators' default since 0.9 and served by vLLM.
      Exclusive with ``fc_norm``.
    * ``norm_output``: the hidden state fed back to the next draft step is
      the final-normed one (post-norm recursion, EAGLE-3.1; speculators'
      ``norm_output``, vLLM's): logits read it without a second norm.
    * ``rope_scaling``: optional non-default RoPE parameters (a transformers
      ``rope_parameters`` dict such as llama3 scaling); ``None`` = plain RoPE.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_aux: int = 3
    num_layers: int = 1
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    tie_word_embeddings: bool = False
    rope_scaling: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        for name, hi in BOUNDS.items():  # before any tensor of these sizes exists
            setattr(self, name, bounded_count(name, getattr(self, name), hi))
        for name in ("rope_theta", "rms_norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
                raise ValueError(f"field {name} = {v!r}: expected a positive number")
            setattr(self, name, float(v))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size ({self.vocab_size})"
            )
        if self.fc_norm and self.norm_before_fc:
            raise ValueError("fc_norm (per slot) and norm_before_fc (all slots) are two ways to normalise the fc "
                             "input: choose one")
        if self.tie_word_embeddings and self.draft_vocab_size != self.vocab_size:
            raise ValueError("tie_word_embeddings needs draft_vocab_size == vocab_size")

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (a deep copy)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DrafterConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DrafterConfig keys: {unknown}")
        return cls(**dict(data))

    @classmethod
    def from_target_config(
        cls, hf_config: Any, draft_vocab_size: int, num_aux: int = 3, **overrides: Any
    ) -> DrafterConfig:
        """Derive a drafter config from the target's transformers config.

        The drafter copies the target's attention geometry so that its embedding
        (copied from the target) and RoPE behave like the target's. Works for
        llama/qwen/mistral-style configs; multimodal configs are reduced to
        their text config. Missing fields fall back: ``head_dim`` to
        ``hidden // heads``, kv heads to heads, ``rope_theta`` from the
        transformers-5 ``rope_parameters`` dict, else the legacy attribute,
        else 10000. ``overrides`` win over derived values; unknown ones raise.
        """
        cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        hidden = int(cfg.hidden_size)
        heads, kv_heads, head_dim = _attention_geometry(cfg, hidden)
        theta, scaling = _rope_from(cfg)
        values: dict[str, Any] = {
            "hidden_size": hidden,
            "intermediate_size": int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": float(
                getattr(cfg, "rms_norm_eps", None) or getattr(cfg, "layer_norm_eps", None) or 1e-6
            ),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "max_position_embeddings": int(getattr(cfg, "max_position_embeddings", None) or 2048),
            "target_hidden_size": hidden,
            "vocab_size": int(cfg.vocab_size),
            "draft_vocab_size": int(draft_vocab_size),
            "num_aux": int(num_aux),
        }
        values.update(overrides)
        return cls.from_dict(values)


def _attention_geometry(cfg: Any, hidden: int) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of the drafter's one Llama attention layer.

    Copied from the target where the target's attention is Llama-like. An MLA target (DeepSeek-V2/V3,
    Kimi-K2/K2.5: ``kv_lora_rank`` set) has no such geometry: transformers sets its ``head_dim`` to the
    rope part alone (``qk_rope_head_dim``, 64 on DeepSeek-V3), which would give a drafter of 7168 / 64
    narrow heads whose product is not the hidden size (the official EAGLE export refuses it). The
    published drafters for these targets use full-width heads of ``v_head_dim`` (128): SpecForge's
    ``configs/deepseek-v3-671b-eagle3.json`` has 56 heads for hidden 7168, i.e. hidden // 128, which is
    what this gives (its Kimi-K2.5 config chose 64 x 128; pass ``num_attention_heads``/``head_dim`` to
    match it). Multi-head (kv heads = heads): MLA's kv heads are latent, there is no count to copy.
    """
    heads = int(cfg.num_attention_heads)
    if getattr(cfg, "kv_lora_rank", None):
        head_dim = int(getattr(cfg, "v_head_dim", None) or hidden // heads)
        mla_heads = max(1, hidden // head_dim)
        return mla_heads, mla_heads, head_dim
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    return heads, kv_heads, int(getattr(cfg, "head_dim", None) or hidden // heads)


def _rope_from(cfg: Any) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, non-default rope parameters or None) of a transformers config."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:  # per-layer-type dicts
        params = params["full_attention"]
    theta = None
    scaling = None
    if isinstance(params, dict):
        theta = params.get("rope_theta")
        if params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if theta is None:
        theta = getattr(cfg, "rope_theta", None)
    if scaling is None:
        legacy = getattr(cfg, "rope_scaling", None)
        if isinstance(legacy, dict) and legacy.get("rope_type", legacy.get("type")) not in (
            None,
            "default",
        ):
            scaling = dict(legacy)
    return float(theta if theta is not None else _DEFAULT_ROPE_THETA), scaling
