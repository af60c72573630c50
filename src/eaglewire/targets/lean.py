"""A lean batch-1 forward of Llama-family decoder stacks for decode and verify steps.

WHY: with the thin-matrix kernel the matrix products of a decode step of the
default target take ~21 ms of its ~43 (2 threads); most of the rest was the
~4,000 small tensor ops and Python frames per step of the general
transformers forward (RMSNorm as six ops, rotary as eight, a cache update
through ``Cache.update``, SDPA's setup for one query row, module hooks). This
forward runs the same mathematics in ~25 ops per layer, as gpt-fast does:
one fused q/k/v product and one fused gate/up product through the kernel,
``torch.rms_norm``, rotary from a position table computed once by the
model's own rotary module, grouped-query attention as two batched products
over the cache's own buffers.

Where the thin-matrix kernel was built, each layer is instead one C++ call
(``kernels/lean_layer.cpp``): the same formulas as plain loops between the
four weight products, writing the new keys and values straight into the
cache's buffers. That took the default target's decode forward from 39 to
30 ms on 2 threads (the products alone ~22 ms); the tensor-op path stays as
the fallback without a compiler, and the tests run both.

Scope, checked by :func:`why_not_lean` (anything else keeps the transformers
forward): CPU fp32, decoder layers of Llama, Mistral, Qwen2 and Qwen3 (their
per-head q/k norms; sliding-window layers by mask, as :func:`window_masks`
reads the config), SiLU MLPs, rotary types whose table does not depend on the sequence length,
1..``MAX_ROWS`` new tokens. Results equal the transformers forward to float
rounding; greedy decoding through it equals transformers ``generate`` (tests).
Weights are shared with the model except the two fused matrices per layer,
which are copies (the price of one product instead of three or two).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.targets.fastlinear import FastLinear
from eaglewire.targets.kvcache import GrowingLayer
from eaglewire.targets.smallm import MAX_ROWS, smallm_kernel

LAYER_TYPES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq and scaling fixed: a table per position is exact


def why_not_lean(base, config) -> str | None:
    """Why this decoder stack cannot take the lean forward (None: it can)."""
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "rotary_emb") or not hasattr(base, "norm"):
        return "not a decoder stack with layers, rotary_emb and norm"
    names = {type(layer).__name__ for layer in layers}
    if not names <= set(LAYER_TYPES):
        return f"decoder layers {sorted(names)} (lean forward: {', '.join(LAYER_TYPES)})"
    if set(getattr(config, "layer_types", None) or []) - {"full_attention", "sliding_attention"}:
        return f"layer types {sorted(set(config.layer_types))}"
    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
        return f"activation {config.hidden_act}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    w = base.embed_tokens.weight
    if w.device.type != "cpu" or w.dtype != torch.float32:
        return f"{w.dtype} on {w.device.type} (lean forward: fp32 on CPU)"
    return None


def _fused(linears: list[nn.Linear]) -> FastLinear:
    weight = torch.cat([m.weight.detach() for m in linears])  # [sum out, in]
    if all(m.bias is None for m in linears):
        bias = None
    else:
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])
    return FastLinear(weight, bias, min_rows=2, pack=False)


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm (``weight * x / rms(x)``, fp32) in one op."""
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


class LeanWeights:
    """One decoder layer's weights as the lean forward reads them: fused q/k/v and gate/up products.

    ``scale``: the attention's softmax scale where the module does not hold it as ``scaling``.
    """

    def __init__(self, layer, scale: float | None = None):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o = FastLinear(attn.o_proj.weight, attn.o_proj.bias, min_rows=2, pack=False)
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        self.down = FastLinear(mlp.down_proj.weight, mlp.down_proj.bias, min_rows=2, pack=False)
        self.ln1, self.ln2 = layer.input_layernorm, layer.post_attention_layernorm
        self.scale = float(attn.scaling if scale is None else scale)
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3: per head

    def fused_args(self) -> tuple:
        """The weights `lean_layer` (kernels/lean_layer.cpp) takes, in its order, up to the cache."""
        qn = (self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon) if self.q_norm is not None \
            else (None, None, 0.0)
        return (self.ln1.weight, self.ln1.variance_epsilon, self.qkv.weight, self.qkv.bias, *qn, self.o.weight,
                self.o.bias, self.ln2.weight, self.ln2.variance_epsilon, self.gate_up.weight, self.gate_up.bias,
                self.down.weight, self.down.bias)


class RopeRows:
    """cos and sign-folded sin rows [N, D] (rotate_half's minus folded in) from a model's own rotary module.

    Rotary types whose table does not depend on the sequence length read a table computed once per
    capacity; the others call the module for the rows asked.
    """

    def __init__(self, rotary_emb, dim: int):
        self.rotary, self.dim = rotary_emb, dim
        self.static = getattr(rotary_emb, "rope_type", "default") in STATIC_ROPE
        self._cos = self._sin = None  # [cap, D] tables, grown on demand

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for positions ``pos`` [N]; ``x`` gives the device and dtype."""
        if not self.static:
            return self._signed(*self.rotary(x, pos[None]))
        need = int(pos.max()) + 1
        if self._cos is None or self._cos.shape[0] < need:
            cap = max(2 * need, 1024)
            grid = torch.arange(cap, device=x.device)[None]  # [1, cap]
            self._cos, self._sin = self._signed(*self.rotary(x, grid))
        return self._cos.index_select(0, pos), self._sin.index_select(0, pos)

    def _signed(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sin = sin[0].clone()  # [T, D]
        sin[:, : self.dim // 2].neg_()
        return cos[0].contiguous(), sin


def layer_windows(config, num_layers: int) -> list[int | None]:
    """Each layer's sliding window (None: full attention), read from the config as transformers does."""
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * num_layers  # Mistral: one window (or none) for every layer


class LeanStack:
    """The decoder stack's forward for 1..MAX_ROWS new tokens of one sequence, on the model's own cache."""

    def __init__(self, base, config):
        self.base = base
        self.hq = config.num_attention_heads
        self.hk = getattr(config, "num_key_value_heads", None) or self.hq
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // self.hq
        self.layers = [LeanWeights(layer) for layer in base.layers]
        self.windows = layer_windows(config, len(self.layers))
        self.rope = RopeRows(base.rotary_emb, self.dim)
        # one C++ call per layer (kernels/lean_layer.cpp) where the kernel was built; else the ops below
        kernel = smallm_kernel()
        self.fused = kernel if hasattr(kernel, "lean_layer") and all(
            f.kernel is not None for lay in self.layers for f in (lay.qkv, lay.o, lay.gate_up, lay.down)) else None
        self._args = [lay.fused_args() for lay in self.layers] if self.fused is not None else None

    def _attend(self, lay: LeanWeights, x: torch.Tensor, cos, sin, cache_layer, blocked) -> torch.Tensor:
        n, hq, hk, d = x.shape[0], self.hq, self.hk, self.dim
        qkv = lay.qkv(x).view(n, hq + 2 * hk, d)  # [N, Hq+2Hk, D]
        qk = qkv[:, : hq + hk]  # [N, Hq+Hk, D]
        if lay.q_norm is not None:
            qk = torch.cat([rms_norm(qk[:, :hq], lay.q_norm), rms_norm(qk[:, hq:], lay.k_norm)], dim=1)
        swapped = torch.roll(qk, d // 2, dims=-1)  # rotate_half without its sign (folded into sin)
        qk = qk * cos[:, None] + swapped * sin[:, None]  # [N, Hq+Hk, D]
        q = qk[:, :hq].transpose(0, 1).reshape(hk, (hq // hk) * n, d)  # [Hk, g*N, D] (query head h -> kv head h // g)
        k_new = qk[:, hq:].transpose(0, 1)[None]  # [1, Hk, N, D]
        v_new = qkv[:, hq + hk:].transpose(0, 1)[None]  # [1, Hk, N, D]
        keys, values = cache_layer.update(k_new, v_new)  # [1, Hk, P+N, D]
        scores = torch.bmm(q, keys[0].transpose(1, 2)).mul_(lay.scale)  # [Hk, g*N, P+N]
        if blocked is not None:
            scores.view(hk, hq // hk, n, -1).masked_fill_(blocked, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.bmm(probs, values[0])  # [Hk, g*N, D]
        return lay.o(out.view(hq, n, d).transpose(0, 1).reshape(n, hq * d))  # [N, H]

    def _blocked(self, allowed, past: int, pos: torch.Tensor) -> dict:
        """{window: bool [N, P+N] True = may not attend, or None} for the windows of this stack."""
        n = pos.shape[0]
        if allowed is None and (n > 1 or any(self.windows)):
            q = past + torch.arange(n, device=pos.device)
            allowed = torch.arange(past + n, device=pos.device)[None] <= q[:, None]  # causal [N, P+N]
        out = {}
        for w in set(self.windows):
            if allowed is None:
                out[w] = None
            elif w is None:
                out[w] = (~allowed).contiguous()  # the C++ layer reads it as a dense [N, P+N] block
            else:  # transformers' convention: attend while q - k < window (positions, so tree rows too)
                k_pos = torch.cat([torch.arange(past, device=pos.device), pos])  # [P+N]
                out[w] = (~(allowed & ((pos[:, None] - k_pos[None]) < w))).contiguous()
        return out

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor | None,
                cache, capture: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """input_ids, position_ids [1, N]; ``allowed`` bool [N, P+N] (None: every cached key and causal among
        the new ones); ``capture`` {"embed" | layer index | "final_norm": point name}. Returns post-norm hidden
        [1, N, H] and {point name: [1, N, H]}."""
        n = input_ids.shape[1]
        if not 1 <= n <= MAX_ROWS:
            raise ValueError(f"lean forward takes 1..{MAX_ROWS} tokens, got {n}")
        past = cache.get_seq_length()
        pos = position_ids[0]
        blocked = self._blocked(allowed, past, pos)
        store = {}
        x = self.base.embed_tokens(input_ids[0])  # [N, H]
        if "embed" in capture:
            store[capture["embed"]] = x[None]
        cos, sin = self.rope(x, pos)
        fused = self.fused is not None and all(type(c) is GrowingLayer for c in cache.layers)
        proto = x.new_empty(1, self.hk, n, self.dim) if fused else None
        for i, lay in enumerate(self.layers):
            if fused:
                held, kb, vb = cache.layers[i].room(proto, proto)  # the C++ layer writes rows held..held+n
                x = self.fused.lean_layer(x.contiguous(), *self._args[i], kb, vb, held, cos, sin,
                                          blocked[self.windows[i]], self.hq, self.hk, self.dim, lay.scale, None)
                cache.layers[i].grow(held + n)
            else:
                x = x + self._attend(lay, rms_norm(x, lay.ln1), cos, sin, cache.layers[i], blocked[self.windows[i]])
                h = rms_norm(x, lay.ln2)
                gate, up = lay.gate_up(h).chunk(2, dim=-1)  # [N, I] each
                x = x + lay.down(F.silu(gate).mul_(up))
            if i in capture:
                store[capture[i]] = x[None]
        out = rms_norm(x, self.base.norm)[None]  # [1, N, H]
        if "final_norm" in capture:
            store[capture["final_norm"]] = out
        return out, store
