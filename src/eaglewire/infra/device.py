"""Device and dtype resolution shared by every command.

Users train and serve on GPUs; this machine has none. Nothing hard-codes
either: `auto` means CUDA (bf16) when present, otherwise CPU (fp32).
"""

from __future__ import annotations

import torch

from eaglewire.infra.errors import EaglewireError

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise EaglewireError(f"--device {name!r}: not a torch device (expected auto, cpu, cuda, cuda:N)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EaglewireError(f"--device {name!r}: CUDA is not available on this machine (use auto or cpu)")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise EaglewireError(f"--dtype {name!r}: expected one of auto, {', '.join(sorted(set(_DTYPES)))}")
    return _DTYPES[name]

