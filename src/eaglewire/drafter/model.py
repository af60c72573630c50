"""EAGLE-3 draft model (official layout), pure model code.

The module does no file I/O and never moves itself: device and dtype follow
its parameters and the inputs. A single explicit-KV entry point, :meth:`step`,
serves training-time test (TTT), chain decoding and tree decoding alike, so
the code path that is trained is exactly the one that is served.

State-dict names (``num_layers == 1``, the official layout)::

    embed_tokens.weight   fc.weight   [fc_norm.weight | input_norm.weight]   norm.weight   lm_head.weight
    midlayer.self_attn.{q,k,v,o}_proj.weight
    midlayer.mlp.{gate,up,down}_proj.weight
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight
    d2t (int64 [draft_vocab])   t2d (bool [vocab])

With ``num_layers > 1`` the layers live in ``layers`` (a ModuleList):
``layers.0.*`` is the EAGLE layer (same sub-names as ``midlayer``, 2H
attention input) and ``layers.1.*`` ... are ordinary Llama decoder layers on
width H (no ``hidden_norm``). A checkpoint is therefore never ambiguous: the
presence of ``midlayer.`` vs ``layers.`` keys tells the layout.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from eaglewire.drafter.attention import causal_attention, causal_attention_lse
from eaglewire.drafter.config import DrafterConfig

KV = tuple[torch.Tensor, torch.Tensor]


def _rotary(cfg: DrafterConfig) -> LlamaRotaryEmbedding:
    """Build transformers' RoPE module from the drafter config.

    RoPE only depends on head_dim / theta / scaling; hidden_size is set to
    heads*head_dim so LlamaConfig's "hidden divisible by heads" check passes
    for targets whose head_dim is not hidden // heads (e.g. Qwen3).
    """
    params: dict = {"rope_type": "default"}
    if cfg.rope_scaling:
        params = dict(cfg.rope_scaling)
        params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = cfg.rope_theta
    max_pos = max(
        cfg.max_position_embeddings, int(params.get("original_max_position_embeddings", 0))
    )
    llama_cfg = LlamaConfig(
        hidden_size=cfg.num_attention_heads * cfg.head_dim,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    return LlamaRotaryEmbedding(llama_cfg)


class SlotRMSNorm(nn.Module):
    """RMSNorm applied separately to each of the ``num_aux`` feature slots.

    Weight is one flat vector ``[num_aux * Ht]`` so the state dict stays
    ``fc_norm.weight``; statistics are per slot because captured layers differ
    wildly in scale.
    """

    def __init__(self, num_aux: int, width: int, eps: float) -> None:
        super().__init__()
        self.num_aux, self.width, self.eps = num_aux, width, eps
        self.weight = nn.Parameter(torch.ones(num_aux * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xs = x.float().unflatten(-1, (self.num_aux, self.width))  # [B, T, A, Ht]
        xs = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xs.flatten(-2).to(dtype)  # [B, T, A*Ht]


class DrafterAttention(nn.Module):
    """GQA attention with explicit KV and an explicit mask (SDPA).

    ``in_dim`` is 2H for the EAGLE layer (cat(embed, hidden)) and H otherwise.
    """

    def __init__(self, cfg: DrafterConfig, in_dim: int) -> None:
        super().__init__()
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, in_dim]
        cos: torch.Tensor,  # [B, T, hd]
        sin: torch.Tensor,  # [B, T, hd]
        past: KV | None,  # ([B, nkv, P, hd], [B, nkv, P, hd])
        mask: torch.Tensor,  # bool [B|1, 1, T, P+T]
    ) -> tuple[torch.Tensor, KV]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past is not None:
            k_all = torch.cat([past[0], k], dim=2)  # [B, nkv, P+T, hd]
            v_all = torch.cat([past[1], v], dim=2)
        else:
            k_all, v_all = k, v
        rep = self.nh // self.nkv
        if q.device.type == "cpu":  # CPU SDPA groups heads itself: no repeat_kv copies
            out = F.scaled_dot_product_attention(
                q, k_all, v_all, attn_mask=mask, enable_gqa=rep > 1
            )  # [B, nh, T, hd]
        else:  # CUDA's masked (memory-efficient) kernel has no GQA; keep explicit copies
            out = F.scaled_dot_product_attention(
                q, repeat_kv(k_all, rep), repeat_kv(v_all, rep), attn_mask=mask
            )  # [B, nh, T, hd]
        out = self.o_proj(out.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # [B, T, H]
        return out, (k, v)

    def forward_ttt(
        self,
        x: torch.Tensor,  # [B, T, in_dim]
        cos: torch.Tensor,  # [B, T, hd]
        sin: torch.Tensor,  # [B, T, hd]
        steps: list[KV],  # keys/values of TTT steps 0..k-1, each [B, nkv, T, hd]
    ) -> tuple[torch.Tensor, KV]:
        """TTT step k = ``len(steps)``: the block mask [causal | eye * k] without the block mask.

        Query t attends to the step-0 keys of positions <= t (causal) and to
        the keys of steps 1..k at position t only (its own new key included
        when k >= 1). The causal part is one causal attention returning its
        log-sum-exp; the k diagonal scores are per-position dot products; the
        two are merged with a softmax over [lse_causal, d_1..d_k], so the result
        equals the masked softmax over all (k+1)T keys (same loss, same
        gradients) at the cost of a T x T causal attention plus O(kT).
        """
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        scale = self.hd**-0.5
        if not steps:  # step 0: plain causal attention over the new keys
            out = causal_attention(q, k, v, scale)  # [B, nh, T, hd]
        else:
            k0, v0 = steps[0]
            o0, lse0 = causal_attention_lse(q, k0, v0, scale)  # [B, nh, T, hd], [B, nh, T]
            rep = self.nh // self.nkv
            kd = torch.stack([kj for kj, _ in steps[1:]] + [k], dim=2)  # [B, nkv, k, T, hd]
            vd = torch.stack([vj for _, vj in steps[1:]] + [v], dim=2)  # [B, nkv, k, T, hd]
            qg = q.unflatten(1, (self.nkv, rep))  # [B, nkv, rep, T, hd]
            # d[..., j, t] = q_t . k_{j+1, t}: [B, nkv, rep, 1, T, hd] x [B, nkv, 1, k, T, hd]
            diag = (qg.unsqueeze(3) * kd.unsqueeze(2)).sum(-1) * scale  # [B, nkv, rep, k, T]
            lse0 = lse0.unflatten(1, (self.nkv, rep)).unsqueeze(3)  # [B, nkv, rep, 1, T]
            w = torch.cat([lse0, diag], dim=3).softmax(dim=3)  # [B, nkv, rep, 1+k, T]
            out = o0.unflatten(1, (self.nkv, rep)) * w[:, :, :, 0, :, None]  # [B,nkv,rep,T,hd]
            # sum_j w_j v_j: [B, nkv, rep, k, T, 1] x [B, nkv, 1, k, T, hd] summed over k
            out = out + (w[:, :, :, 1:, :, None] * vd.unsqueeze(2)).sum(3)
            out = out.flatten(1, 2)  # [B, nh, T, hd]
        out = self.o_proj(out.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # [B, T, H]
        return out, (k, v)


class DrafterLayer(nn.Module):
    """One decoder layer. ``eagle=True``: the EAGLE-3 midlayer (2H attention input)."""

    def __init__(self, cfg: DrafterConfig, eagle: bool) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.eagle = eagle
        self.norm_before_residual = cfg.norm_before_residual
        self.self_attn = DrafterAttention(cfg, 2 * h if eagle else h)
        mlp_cfg = SimpleNamespace(
            hidden_size=h,
            intermediate_size=cfg.intermediate_size,
            mlp_bias=False,
            hidden_act="silu",
        )
        self.mlp = LlamaMLP(mlp_cfg)
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        if eagle:
            self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)

    def forward(
        self,
        hidden: torch.Tensor,  # [B, T, H]
        embeds: torch.Tensor | None,  # [B, T, H] raw token embeddings (eagle layer only)
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: KV | None,
        mask: torch.Tensor | None,
        ttt_steps: list[KV] | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """``ttt_steps`` given: TTT attention (see ``DrafterAttention.forward_ttt``), no mask."""
        if self.eagle:
            h_n = self.hidden_norm(hidden)  # [B, T, H]
            residual = h_n if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), h_n], dim=-1)  # [B, T, 2H], embed first
        else:
            residual = hidden
            x = self.input_layernorm(hidden)  # [B, T, H]
        if ttt_steps is None:
            attn, kv = self.self_attn(x, cos, sin, past, mask)
        else:
            attn, kv = self.self_attn.forward_ttt(x, cos, sin, ttt_steps)
        hidden = residual + attn  # [B, T, H]
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, kv


class Eagle3Drafter(nn.Module):
    """EAGLE-3 draft head: fc over target features, one EAGLE layer, draft lm_head."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        if c.fc_norm:
            self.fc_norm = SlotRMSNorm(c.num_aux, c.target_hidden_size, c.rms_norm_eps)
        if c.norm_before_fc:
            self.input_norm = LlamaRMSNorm(c.num_aux * c.target_hidden_size, eps=c.rms_norm_eps)
        self.fc = nn.Linear(c.num_aux * c.target_hidden_size, c.hidden_size, bias=False)
        if c.num_layers == 1:
            self.midlayer = DrafterLayer(c, eagle=True)
        else:
            self.layers = nn.ModuleList(
                DrafterLayer(c, eagle=(i == 0)) for i in range(c.num_layers)
            )
        self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary_emb = _rotary(c)
        # d2t: offsets, target_id = draft_id + d2t[draft_id]; zeros = identity.
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[: c.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)

    # ------------------------------------------------------------ plumbing
    @property
    def decoder_layers(self) -> list[DrafterLayer]:
        """Layers in order, whatever the naming (``midlayer`` or ``layers``)."""
        return [self.midlayer] if self.config.num_layers == 1 else list(self.layers)

    @torch.no_grad()
    def load_target_embedding(self, weight: torch.Tensor) -> None:
        """Copy the target's input embedding ``[vocab, H]`` in and freeze it."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(
                f"embedding shape {tuple(weight.shape)} != {tuple(self.embed_tokens.weight.shape)}"
            )
        self.embed_tokens.weight.copy_(weight)
        self.embed_tokens.weight.requires_grad_(False)

    @torch.no_grad()
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Install the draft vocabulary given as target ids (one per draft id).

        Ids must be unique and ascending (the convention: draft id order =
        target id order), which keeps d2t >= 0 and makes ``t2d`` selection and
        ``d2t`` indexing enumerate the same columns in the same order.
        """
        ids = torch.as_tensor(target_ids, dtype=torch.long, device=self.d2t.device).flatten()
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"expected {self.config.draft_vocab_size} ids, got {ids.numel()}")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft vocab target ids must be strictly ascending")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError("draft vocab target id out of range")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_target_ids(self) -> torch.Tensor:
        """Target id of every draft id, ``[draft_vocab]`` int64."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids (any shape) to target-vocab ids."""
        return ids + self.d2t[ids]

    # ------------------------------------------------------------- compute
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[B, T, A*Ht]`` -> drafter hidden ``[B, T, H]``."""
        return self.fc(self.fc_input(features))

    def fc_input(self, features: torch.Tensor) -> torch.Tensor:
        """What ``fc`` reads: the features ``[B, T, A*Ht]``, normed where the config says (decoding runs its
        own copy of ``fc``)."""
        if self.config.fc_norm:
            features = self.fc_norm(features)
        if self.config.norm_before_fc:
            features = self.input_norm(features)
        return features

    def fed_back(self, hidden: torch.Tensor, norm=None) -> torch.Tensor:
        """What the next draft step reads: the layer output, or with ``norm_output`` its normed form.

        ``norm``: what applies ``self.norm`` (default the module itself; CPU decoding passes a one-op form),
        so the rule of which side is normed lives here only."""
        return (norm or self.norm)(hidden) if self.config.norm_output else hidden

    def step(
        self,
        input_ids: torch.Tensor,  # [B, T]
        hidden: torch.Tensor,  # [B, T, H] projected features or previous draft output
        position_ids: torch.Tensor,  # [B, T] (or [1, T])
        past_kv: list[KV] | None,  # per layer ([B, nkv, P, hd], [B, nkv, P, hd])
        attn_mask: torch.Tensor,  # bool [B|1, 1, T, P+T], True = may attend
    ) -> tuple[torch.Tensor, list[KV]]:
        """Run the decoder layers on T new tokens against an explicit KV prefix.

        Returns the hidden output ``[B, T, H]`` that gets fed back (un-normed;
        normed with ``norm_output``) and, per layer, the rotated K/V of the T new tokens only; the caller
        owns the cache and concatenates. A query row must allow at least one
        key (SDPA yields NaN for fully masked rows).
        """
        layers = self.decoder_layers
        if past_kv is not None and len(past_kv) != len(layers):
            raise ValueError(f"past_kv has {len(past_kv)} entries for {len(layers)} layers")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        position_ids = position_ids.expand(hidden.shape[0], -1)
        cos, sin = self.rotary_emb(hidden, position_ids)  # [B, T, hd] each
        mask = attn_mask.to(device=hidden.device, dtype=torch.bool)
        new_kv: list[KV] = []
        for i, layer in enumerate(layers):
            past = None if past_kv is None else past_kv[i]
            hidden, kv = layer(hidden, embeds if i == 0 else None, cos, sin, past, mask)
            new_kv.append(kv)
        return self.fed_back(hidden), new_kv

    def step_ttt(
        self,
        input_ids: torch.Tensor,  # [B, T]
        hidden: torch.Tensor,  # [B, T, H]
        position_ids: torch.Tensor,  # [B, T] (or [1, T])
        ttt_cache: list[list[KV]] | None,  # per layer, per earlier step: [B, nkv, T, hd]
    ) -> tuple[torch.Tensor, list[KV]]:
        """TTT step k over all T positions; k = number of cached steps (0 when ``None``).

        Same result as :meth:`step` with the past = the k cached steps
        concatenated and the block mask [causal | eye * k] (query t sees the
        step-0 keys of positions <= t and the keys of steps 1..k at t), but
        without materialising the (k+1)T-key mask: one causal attention plus
        per-position dot products. Returns the hidden output and, per layer,
        the new step's K/V (the caller appends them to its per-layer list).
        """
        layers = self.decoder_layers
        if ttt_cache is None:
            ttt_cache = [[] for _ in layers]
        if len(ttt_cache) != len(layers):
            raise ValueError(f"ttt_cache has {len(ttt_cache)} entries for {len(layers)} layers")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        position_ids = position_ids.expand(hidden.shape[0], -1)
        cos, sin = self.rotary_emb(hidden, position_ids)  # [B, T, hd] each
        new_kv: list[KV] = []
        for i, layer in enumerate(layers):
            hidden, kv = layer(
                hidden, embeds if i == 0 else None, cos, sin, None, None, ttt_steps=ttt_cache[i]
            )
            new_kv.append(kv)
        return self.fed_back(hidden), new_kv

    def head_input(self, hidden: torch.Tensor, norm=None) -> torch.Tensor:
        """What lm_head reads from a step's output ``[B, T, H]``: normed once, whichever form was fed back
        (``norm`` as in :meth:`fed_back`)."""
        return hidden if self.config.norm_output else (norm or self.norm)(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits ``[B, T, D]`` from a step's output ``[B, T, H]``."""
        return self.lm_head(self.head_input(hidden))


def causal_mask(t: int, past: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """bool ``[1, 1, T, past+T]``: query i sees every past key and new keys <= i."""
    q = torch.arange(t, device=device)[:, None] + past
    k = torch.arange(past + t, device=device)[None, :]
    return (k <= q)[None, None]
