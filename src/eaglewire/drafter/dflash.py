"""DFlash block drafter, pure model code (no I/O; device and dtype follow the inputs).

Follows, read at the versions named in ``docs/parallel-drafters.md``:

* z-lab ``dflash`` 44947fb, ``dflash/model.py`` (``DFlashDraftModel``,
  ``Qwen3DFlashAttention``, ``Qwen3DFlashDecoderLayer``),
* SpecForge a6b6b02, ``specforge/modeling/draft/dflash.py``,
* vLLM 0.32.0, ``vllm/model_executor/models/qwen3_dflash.py``
  (``precompute_and_store_context_kv``, ``combine_hidden_states``).

What makes it DFlash rather than EAGLE-3: the captured target states are
fused once (``hidden_norm(fc(cat))``) and enter every draft layer as extra
keys/values (KV injection), not as an input; the drafted tokens form one
block ``[bonus, MASK x (B-1)]`` whose slots attend to each other both ways
and each read the token at their own position. The drafter owns no
embedding and no lm_head: the target's embed the block and read the output,
so its hidden size is the target's.

Two explicit-KV entry points serve training and decoding alike (as
``model.py``'s ``step`` does for EAGLE-3): :meth:`DFlashDrafter.context_kv`
turns target features into per-layer context K/V once per target token
(vLLM's precompute), :meth:`DFlashDrafter.block` runs block queries against
a context K/V and an optional explicit mask.

State-dict names (the z-lab layout, what vLLM / SGLang / llama.cpp load)::

    fc.weight  hidden_norm.weight  norm.weight
    layers.{i}.self_attn.{q,k,v,o}_proj.weight  layers.{i}.self_attn.{q,k}_norm.weight
    layers.{i}.mlp.{gate,up,down}_proj.weight
    layers.{i}.{input_layernorm,post_attention_layernorm}.weight
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from eaglewire.drafter.config import BOUNDS, MAX_POSITIONS, bounded_count
from eaglewire.targets.points import Point, layer_out

KV = tuple[torch.Tensor, torch.Tensor]


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's ``build_target_layer_ids``: one id per draft layer, z-lab meaning (id k = ``layers.{k}.out``).

    ``[L//2]`` for one draft layer, else ``round(1 + j*(L-4)/(n-1))`` with Python's half-to-even
    rounding (z-lab, SpecForge, ModelOpt and SGLang ``dflash_utils.py`` agree): (36, 5) -> [1, 9, 17, 25, 33].
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + j * span / (num_draft_layers - 1)) for j in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    """Shape of a :class:`DFlashDrafter`.

    ``hidden_size`` is the target's: the block is embedded by the target's
    embedding and the target's lm_head reads the output. ``target_layer_ids``
    use the z-lab meaning (id k = ``layers.{k}.out``, ascending, concatenated
    in that order); ``mask_token_id`` must be a row of the target embedding.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "vocab_size", "max_position_embeddings"):
            bounded_count(name, getattr(self, name), BOUNDS[name])
        bounded_count("num_layers", self.num_layers, BOUNDS["num_layers"])
        bounded_count("block_size", self.block_size, 1024, lo=2)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        ids = list(self.target_layer_ids)
        if not ids or any(not isinstance(i, int) or i < 0 for i in ids) or ids != sorted(set(ids)):
            raise ValueError(f"target_layer_ids {ids}: expected distinct ascending layer ids >= 0 "
                             "(z-lab meaning, id k = layers.{k}.out; `embed` is not servable)")
        bounded_count("mask_token_id", self.mask_token_id, self.vocab_size - 1, lo=0)
        bounded_count("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS)

    @property
    def num_aux(self) -> int:
        return len(self.target_layer_ids)

    @property
    def points(self) -> list[Point]:
        """The target points the fc reads, in concatenation order."""
        return [layer_out(k) for k in self.target_layer_ids]

    @classmethod
    def from_target_config(cls, target_config, *, mask_token_id: int, block_size: int = 16,
                           num_layers: int = 1, target_layer_ids: list[int] | None = None) -> DFlashConfig:
        """A drafter shaped like the target's layers (equal KV page sizes), z-lab's default ids."""
        c = target_config
        heads = int(c.num_attention_heads)
        ids = target_layer_ids or default_target_layer_ids(int(c.num_hidden_layers), num_layers)
        return cls(
            hidden_size=int(c.hidden_size), intermediate_size=int(c.intermediate_size), num_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads), vocab_size=int(c.vocab_size),
            target_layer_ids=tuple(ids), mask_token_id=mask_token_id, block_size=block_size,
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(c)),
            max_position_embeddings=int(getattr(c, "max_position_embeddings", 40960)),
        )

    def qwen3(self) -> Qwen3Config:
        """The Qwen3 config transformers' building blocks (MLP, RoPE) read; also what an export writes."""
        return Qwen3Config(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta}, hidden_act="silu",
        )


def _rope_theta(c) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    return params.get("rope_theta") or getattr(c, "rope_theta", None) or 1_000_000.0


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[B, n, T, hd]`` with ``cos``/``sin`` ``[B, T, hd]`` (context keys have no query partner)."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class DFlashAttention(nn.Module):
    """Qwen3 attention (per-head q_norm / k_norm) whose keys/values are the context's then the block's."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        nh, nkv, hd, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(hd, eps=cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Rotated keys and values ``[B, nkv, T, hd]`` of ``x`` ``[B, T, H]`` (context or block alike)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.hd)).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        return _rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H] normed block input
        cos: torch.Tensor,  # [B, Q, hd]
        sin: torch.Tensor,  # [B, Q, hd]
        ctx: KV | None,  # ([B, nkv, C, hd], [B, nkv, C, hd]) context K/V of this layer
        mask: torch.Tensor | None,  # bool [B|1, 1, Q, C+Q]; None = every key visible
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.nh, self.hd)).transpose(1, 2)  # [B, nh, Q, hd]
        q = _rope(q, cos, sin)
        k, v = self.kv(x, cos, sin)  # [B, nkv, Q, hd]
        if ctx is not None:
            k = torch.cat([ctx[0], k], dim=2)  # [B, nkv, C+Q, hd]
            v = torch.cat([ctx[1], v], dim=2)
        rep = self.nh // self.nkv
        if rep > 1 and q.device.type != "cpu":  # CUDA's masked kernel has no GQA (as model.py)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=rep > 1 and q.device.type == "cpu")  # [B, nh, Q, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.nh * self.hd))  # [B, Q, H]


class DFlashLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer; the context K/V are projected from the fused states without input_layernorm
    (z-lab ``Qwen3DFlashAttention.forward`` projects ``target_hidden`` as is)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = Qwen3MLP(cfg.qwen3())
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: KV | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx, mask)  # [B, Q, H]
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """fc + hidden_norm over the captured target states, N Qwen3 layers with KV injection, final norm."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = c = config
        self.fc = nn.Linear(c.num_aux * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(c.qwen3())

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Captured states ``[B, C, A*H]`` (concatenated in id order) -> fused context ``[B, C, H]``."""
        if features.shape[-1] != self.fc.in_features:
            raise ValueError(f"features of width {features.shape[-1]}: the fc expects {self.config.num_aux} "
                             f"concatenated states of width {self.config.hidden_size}")
        return self.hidden_norm(self.fc(features))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Per layer, the context K/V ``[B, nkv, C, hd]`` of target features ``[B, C, A*H]`` at ``positions`` ``[B|1, C]``.

        Computed once per target token and kept: the same fused state feeds every layer (vLLM's
        ``precompute_and_store_context_kv``)."""
        ctx = self.fuse(features)  # [B, C, H]
        cos, sin = self.rotary_emb(ctx, positions.expand(ctx.shape[0], -1))  # [B, C, hd]
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def block(
        self,
        embeds: torch.Tensor,  # [B, Q, H] target-embedded block tokens ([bonus, MASK...] per block)
        positions: torch.Tensor,  # [B|1, Q] position of every query
        ctx_kv: list[KV] | None,  # per layer ([B, nkv, C, hd], [B, nkv, C, hd])
        mask: torch.Tensor | None = None,  # bool [B|1, 1, Q, C+Q], True = may attend; None = all
    ) -> torch.Tensor:
        """The normed output ``[B, Q, H]`` the target's lm_head reads; slot k drafts the token at its own position.

        ``mask=None`` is inference: one block, bidirectional, sees the whole context. Training passes the
        multi-block mask (``training/dflash_loss.py``). A query row must allow at least one key."""
        if ctx_kv is not None and len(ctx_kv) != len(self.layers):
            raise ValueError(f"ctx_kv has {len(ctx_kv)} entries for {len(self.layers)} layers")
        h = embeds
        cos, sin = self.rotary_emb(h, positions.expand(h.shape[0], -1))  # [B, Q, hd]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, None if ctx_kv is None else ctx_kv[i], mask)
        return self.norm(h)


def cat_context(a: list[KV] | None, b: list[KV]) -> list[KV]:
    """Per layer, context K/V ``a`` then ``b`` along the positions (the decoder's growing context)."""
    if a is None:
        return b
    return [(torch.cat([ak, bk], 2), torch.cat([av, bv], 2)) for (ak, av), (bk, bv) in zip(a, b, strict=True)]
