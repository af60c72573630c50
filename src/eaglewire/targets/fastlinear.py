"""Linear layers for CPU decoding: a thin-matrix kernel and oneDNN-prepacked weights.

WHY: at decode batch sizes (M = 1..64 rows) MKL's sgemm re-reads the weight in
its plain layout every call, and the target's lm_head is the largest matrix
of a small target. oneDNN with the weight reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, the path inductor's CPU
backend uses) makes verifying a few rows cost about what one row costs, and
speeds up batched answer generation (figures and the commands behind them:
``benchmarks/README.md``).

Numerics: fp32 results differ from MKL by float rounding only (~1e-5
relative); greedy exactness against the unmodified target is checked in the
tests. Anything other than fp32 on CPU (or a torch without the op) falls back
to ``F.linear`` so the code path is always valid.

Calls of 1..16 rows (decode, verify, drafting) go first to the
thin-matrix kernel of :mod:`eaglewire.targets.smallm` when it could be built
(both cores on one weight stream); it is ``None`` without a compiler, and then
the oneDNN / MKL paths above serve those rows too.

``packed_linears`` swaps the forward of a model's ``nn.Linear`` modules in a
``with`` block and restores them on exit, so the user's model object is never
left modified (the transformers baselines in ``bench`` must run unpacked).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.targets.smallm import in_features, smallm_kernel, usable, widened


def _packable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class FastLinear(nn.Module):
    """y = x W^T (+ b) with a weight prepacked once for oneDNN; any leading shape."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 8,
                 min_rows: int = 1, max_rows: int = 64, pack: bool = True, kernel: bool = True):
        super().__init__()
        # Outside [min_rows, max_rows] MKL wins: oneDNN builds a primitive per new
        # row count (paid once per prefill length), and at M=1 MKL is as fast
        # for the small decoder matrices.
        self.min_rows, self.max_rows = min_rows, max_rows
        self.out_features, self.in_features = weight.shape[0], in_features(weight)
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.packed = None
        # the thin-matrix kernel, for 1..MAX_ROWS rows (targets/smallm.py) (None: not built here); it also takes
        # a bf16 or int8-row weight (a drafter's, decoding/draft_lean.py), widened in registers
        narrow = self.weight.device.type == "cpu" and self.weight.dtype in (torch.bfloat16, torch.int8)
        self.kernel = smallm_kernel() if kernel and (_packable(self.weight) or narrow) else None
        if self.kernel is not None:
            self.weight = self.weight.contiguous()
            self.bias = None if self.bias is None else self.bias.contiguous()
        if pack and _packable(self.weight):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, batch_hint)
            except RuntimeError:  # oneDNN without the op for this shape: stay on MKL
                self.packed = None

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        """F.linear, a weight of another dtype than x (a bf16 or int8-row one beside fp32 rows) widened to x's."""
        return F.linear(x, self.weight if self.weight.dtype == x.dtype else widened(self.weight).to(x.dtype), self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if (self.packed is None and self.kernel is None) or x.dtype != torch.float32 or x.device.type != "cpu":
            return self._plain(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()  # [M, in]
        if self.kernel is not None and usable(x2, self.weight):
            return self.kernel.linear(x2, self.weight, self.bias).reshape(*lead, self.out_features)
        if self.packed is None or not self.min_rows <= x2.shape[0] <= self.max_rows:
            return self._plain(x)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.reshape(*lead, self.out_features)


@contextmanager
def packed_linears(model: nn.Module, enabled: bool = True, min_numel: int = 1 << 18, kernel_numel: int = 1 << 16):
    """Temporarily route the large ``nn.Linear`` layers of ``model`` through FastLinear.

    Only weights with >= ``min_numel`` elements are packed (for tiny matrices
    the oneDNN call overhead exceeds the matmul) and only calls with 2..64
    rows use the pack (verify / tree drafting sizes). Weights with >=
    ``kernel_numel`` elements take the thin-matrix kernel for 1..16 rows when
    it is built. Packing copies each weight; the packs are cached on the
    module object so re-entering is cheap.
    """
    if not enabled:
        yield
        return
    swapped = []
    for mod in model.modules():
        big = type(mod) is nn.Linear and _packable(mod.weight) and mod.weight.numel() >= min(min_numel, kernel_numel)
        if big and (mod.weight.numel() >= min_numel or smallm_kernel() is not None):
            fast = getattr(mod, "_eaglewire_fast", None)
            if fast is None or fast.weight.data_ptr() != mod.weight.data_ptr():
                fast = FastLinear(mod.weight, mod.bias, min_rows=2, pack=mod.weight.numel() >= min_numel)
                object.__setattr__(mod, "_eaglewire_fast", fast)
            mod.forward = fast.forward  # instance attribute shadows the class method
            swapped.append(mod)
    try:
        yield
    finally:
        for mod in swapped:
            del mod.forward
