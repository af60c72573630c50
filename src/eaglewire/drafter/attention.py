"""The drafter's causal attention for training-time test, with the log-sum-exp TTT merges steps by.

Why a file of its own: the model (model.py) says what an EAGLE-3 layer computes;
this says how one attention is computed fast on a CPU, down to a custom
autograd function around PyTorch's CPU flash kernel, whose backward is fed a
gradient for the log-sum-exp the kernel itself has no input for. The matmul
form beside it is the device-agnostic fallback and the kernel's test reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import repeat_kv


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal GQA attention ``[B, nh, T, hd]`` over ``[B, nkv, T, hd]`` keys (SDPA)."""
    rep = q.shape[1] // k.shape[1]
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=rep > 1
        )
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, rep), repeat_kv(v, rep), is_causal=True, scale=scale
    )


_cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_cpu_flash_bwd = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None
)
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class _CPUFlashCausalLSE(torch.autograd.Function):
    """Causal GQA attention on CPU's flash kernel returning (out, lse), both differentiable.

    The kernel's backward only knows ``dout``; it forms dS = P * (dP - D) with
    D = rowsum(dout * out). A gradient ``dlse`` enters as dS = P * (dP - D +
    dlse), which the unmodified kernel computes when handed one extra head
    column: zero in q, k, v, ``-dlse`` in ``out`` and 1 in ``dout`` (scores and
    dP are unchanged, D becomes D - dlse).
    """

    @staticmethod
    def forward(ctx, q, k, v, scale):  # noqa: ANN001, ANN205
        out, lse = _cpu_flash(q, k, v, 0.0, True, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None and dlse is None:
            return None, None, None, None
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is None:
            grads = _cpu_flash_bwd(dout, q, k, v, out, lse, 0.0, True, scale=ctx.scale)
            return grads[0], grads[1], grads[2], None
        hd = q.shape[-1]
        pad = (0, 1)
        out_x = torch.cat([out, -dlse.unsqueeze(-1).to(out.dtype)], dim=-1)
        dq, dk, dv = _cpu_flash_bwd(
            F.pad(dout, pad, value=1.0),
            F.pad(q, pad),
            F.pad(k, pad),
            F.pad(v, pad),
            out_x,
            lse,
            0.0,
            True,
            scale=ctx.scale,
        )
        return dq[..., :hd], dk[..., :hd], dv[..., :hd], None


def causal_attention_lse(
    q: torch.Tensor,  # [B, nh, T, hd]
    k: torch.Tensor,  # [B, nkv, T, hd]
    v: torch.Tensor,  # [B, nkv, T, hd]
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention and its log-sum-exp: ``([B, nh, T, hd], [B, nh, T])``.

    CPU: the flash kernel (never materialises T x T, skips the upper blocks).
    Elsewhere: grouped matmul + causal mask + logsumexp, differentiable by autograd.
    """
    if q.device.type == "cpu" and _cpu_flash is not None and q.dtype in _FLASH_DTYPES:
        return _CPUFlashCausalLSE.apply(q, k, v, scale)
    return causal_attention_lse_matmul(q, k, v, scale)


def causal_attention_lse_matmul(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference/fallback for :func:`causal_attention_lse` (materialises T x T scores)."""
    b, nh, t, hd = q.shape
    nkv = k.shape[1]
    qg = q.reshape(b, nkv, (nh // nkv) * t, hd)  # heads of a group stacked on rows
    s = (qg @ k.transpose(-1, -2)).view(b, nh, t, t) * scale  # [B, nh, T, T]
    upper = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(upper, float("-inf"))
    lse = s.logsumexp(dim=-1)  # [B, nh, T]
    p = (s - lse.unsqueeze(-1)).exp()
    out = (p.view(b, nkv, -1, t) @ v).view(b, nh, t, hd)
    return out, lse
