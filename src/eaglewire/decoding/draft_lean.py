"""The drafter's KV buffers and its step as one C++ call per layer.

WHY: once the target's layers were one C++ call each, drafting was a quarter
of a decode step per round (~11 ms of ~47 on the default target): an extend
and a tree level each ran ~40 small tensor ops, a ``torch.cat`` of the whole
drafter cache per layer and step, and the patched-linear context. Here the
cache is a pair of buffers per layer that grow by doubling (a round's draft
entries are written after the real ones and overwritten by the next extend),
and each layer runs in ``lean_layer`` (targets/kernels/lean_layer.cpp), the
same call the target's layers use. The EAGLE layer's own input, the
concatenation of the normed embedding and the normed hidden state (2H), is
formed here and handed to the call as the rows its q/k/v product reads.

Scope, checked by :func:`why_not_lean_draft`: fp32 on CPU with the kernel
built, the drafter's rotary a type the target's lean forward takes. Results
equal :meth:`Eagle3Drafter.step` to float rounding (tests/decoding).

``weights="bf16"`` keeps the layers' four weight matrices (and, in
decoding/draft.py, the draft head and the fc projection) in bf16 for drafting. Why: between two
target passes the drafter's ~35 MB are evicted, so every draft step streams
them from memory again (a chain of 3 read ~110 MB a round, ~0.2 of a decode
step); bf16 halves that. Products still sum in fp32 over the widened weights,
so the drafts are those of the drafter with bf16-rounded weights, as GPUs
serve it. ``weights="int8"`` halves it again: each matrix row as int8 with
one fp32 scale (targets/smallm.py's ``quantize_rows``), the drafts those of
the drafter with its rows rounded to 255 levels; and the drafter's footprint
in the last-level cache shrinks with it, which also left the target's
verify faster (docs/results.md). The target's verify is untouched: outputs
stay exact.
"""

from __future__ import annotations

import torch

from eaglewire.drafter.model import KV, Eagle3Drafter
from eaglewire.targets.lean import LeanWeights, RopeRows, rms_norm
from eaglewire.targets.smallm import MAX_ROWS, quantize_rows, smallm_kernel

DRAFT_WEIGHTS = ("fp32", "bf16", "int8")  # what the drafter's matrices are streamed as while drafting on CPU


def narrowed(w: torch.Tensor, weights: str) -> torch.Tensor:
    """A drafter matrix [N, K] as drafting streams it (``weights`` one of :data:`DRAFT_WEIGHTS`)."""
    if weights == "fp32":
        return w
    if weights == "bf16":
        return w.bfloat16()
    if weights == "int8":
        return quantize_rows(w)
    raise ValueError(f"draft weights {weights!r}: expected one of {', '.join(DRAFT_WEIGHTS)}")


class DraftCache:
    """Per drafter layer, K and V buffers ``[1, Hk, cap, D]``; rows are written in place, never concatenated."""

    def __init__(self, drafter: Eagle3Drafter):
        c = drafter.config
        p = next(drafter.parameters())
        self.layers, self.hk, self.dim, self.like = len(drafter.decoder_layers), c.num_key_value_heads, c.head_dim, p
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.cap = 0

    def room(self, n: int) -> None:
        """Capacity for ``n`` rows, keeping every row written so far."""
        if n <= self.cap:
            return
        cap = max(2 * n, 256)
        new = [self.like.new_zeros(1, self.hk, cap, self.dim) for _ in range(2 * self.layers)]
        for old, buf in zip(self.k + self.v, new, strict=False):
            buf[:, :, : self.cap].copy_(old)
        self.k, self.v, self.cap = new[: self.layers], new[self.layers :], cap

    def past(self, n: int) -> list[KV] | None:
        """Views of the first ``n`` rows per layer (None when n == 0: the model's step takes no past)."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.k, self.v, strict=True)] if n else None

    def write(self, at: int, new: list[KV]) -> None:
        """Store the new rows ``[1, Hk, T, D]`` of every layer at rows at..at+T."""
        for (kn, vn), k, v in zip(new, self.k, self.v, strict=True):
            t = kn.shape[2]
            k[:, :, at : at + t].copy_(kn)
            v[:, :, at : at + t].copy_(vn)


def why_not_lean_draft(drafter: Eagle3Drafter) -> str | None:
    """Why this drafter cannot take the one-call-per-layer step (None: it can)."""
    p = next(drafter.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        return f"{p.dtype} on {p.device.type} (fp32 on CPU needed)"
    kernel = smallm_kernel()
    if kernel is None or not hasattr(kernel, "lean_layer"):
        return "the thin-matrix kernel was not built"
    if not RopeRows(drafter.rotary_emb, drafter.config.head_dim).static:
        return f"rotary type {getattr(drafter.rotary_emb, 'rope_type', '?')}"
    return None


class LeanDraft:
    """:meth:`Eagle3Drafter.step` for 1..MAX_ROWS tokens of one sequence, writing into a :class:`DraftCache`.

    The fused weight matrices are copies taken when it is built: a drafter
    whose weights change afterwards needs a new one (decoding builds it per
    engine).
    """

    def __init__(self, drafter: Eagle3Drafter, weights: str = "fp32"):
        if weights not in DRAFT_WEIGHTS:
            raise ValueError(f"draft weights {weights!r}: expected one of {', '.join(DRAFT_WEIGHTS)}")
        c = drafter.config
        self.drafter, self.kernel = drafter, smallm_kernel()
        self.hq, self.hk, self.dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.layers = drafter.decoder_layers
        self.weights = [LeanWeights(layer, scale=c.head_dim**-0.5) for layer in self.layers]
        self.args = [w.fused_args() for w in self.weights]
        if weights != "fp32":  # the matrices only: norm weights and biases are 1-D and stay fp32
            self.args = [tuple(narrowed(a, weights) if isinstance(a, torch.Tensor) and a.dim() == 2 else a
                               for a in args) for args in self.args]
        self.rope = RopeRows(drafter.rotary_emb, c.head_dim)

    @classmethod
    def build(cls, drafter: Eagle3Drafter, weights: str = "fp32") -> LeanDraft | None:
        return cls(drafter, weights) if why_not_lean_draft(drafter) is None else None

    def step(self, ids: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, cache: DraftCache, used: int,
             blocked: torch.Tensor | None) -> torch.Tensor:
        """ids [1, T]; hidden [1, T, H]; pos [T]; blocked bool [T, used+T] (True = may not attend; None: every
        key). Writes the T new K/V rows at ``used``; returns what the next step reads [1, T, H]."""
        if not 1 <= ids.shape[1] <= MAX_ROWS:
            raise ValueError(f"the lean drafter step takes 1..{MAX_ROWS} tokens, got {ids.shape[1]}")
        h = hidden[0].contiguous()  # [T, H]
        cos, sin = self.rope(h, pos)  # [T, D] each
        for i, (layer, w) in enumerate(zip(self.layers, self.weights, strict=True)):
            attn_in, residual = None, h
            if layer.eagle:
                h_n = rms_norm(h, layer.hidden_norm)  # [T, H]
                emb = self.drafter.embed_tokens(ids[0]).to(h.dtype)  # [T, H]
                attn_in = torch.cat([rms_norm(emb, layer.input_layernorm), h_n], dim=-1)  # [T, 2H], embed first
                residual = h_n if layer.norm_before_residual else h
            h = self.kernel.lean_layer(residual.contiguous(), *self.args[i], cache.k[i], cache.v[i], used, cos, sin,
                                       blocked, self.hq, self.hk, self.dim, w.scale, attn_in)
        return self.drafter.fed_back(h, self.norm)[None]  # [1, T, H]

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        """The drafter's final norm in one op (the module runs transformers' RMSNorm, several)."""
        return rms_norm(h, self.drafter.norm)
