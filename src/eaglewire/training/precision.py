"""The drafter's compute precision: fp32, or bf16 autocast over fp32 master weights (as the anchors train).

SpecForge and speculators train EAGLE-3 drafters in bf16 on GPUs with the weights, gradients and AdamW
state kept in fp32: autocast runs the matmuls in bf16 and the reductions (softmax, the loss) in fp32, so
the update is the fp32 one to bf16 rounding while the step costs a bf16 step. TF32 goes with it on CUDA
(the fp32 matmuls autocast leaves). CPU stays fp32 unless asked: bf16 there is slower on most hosts and
only useful to check a CUDA run's numerics.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


def resolve_precision(precision: str, device: torch.device) -> str:
    """fp32 or bf16 for `--precision` on `device` (auto: bf16 on CUDA, fp32 elsewhere)."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def apply_precision(precision: str, device: torch.device) -> str:
    """Resolve `precision` and set the process-wide matmul modes it implies; returns fp32 or bf16."""
    got = resolve_precision(precision, device)
    if device.type == "cuda":
        tf32 = got == "bf16"  # strict fp32 when fp32 is asked for: no TF32 either
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return got


def autocast(precision: str, device: torch.device):
    """The context a forward runs in: bf16 autocast, or nothing (fp32)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()
