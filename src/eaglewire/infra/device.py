"""Device and dtype resolution shared by every command.

Users train and serve on GPUs; this machine has none. Nothing hard-codes
either: `auto` means CUDA (bf16) when present, otherwise CPU (fp32).
"""

from __future__ import annotations

import torch

from eaglewire.infra.errors import EaglewireError, did_you_mean

# Short names first: `dtype_name` gives the first name of a dtype, the one our files record.
DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str | None:
    """fp32, bf16 or fp16 (None for any other dtype)."""
    return next((k for k, v in DTYPES.items() if v == dtype), None)


def dtype_from_name(name: str, flag: str = "--dtype") -> torch.dtype:
    """The torch dtype of an option's value; an unknown name stops the command naming `flag`."""
    if name not in DTYPES:
        raise EaglewireError(f"{flag} {name!r}: expected one of {', '.join(DTYPES)}{did_you_mean(name, DTYPES)}")
    return DTYPES[name]


def auto_device_type() -> str:
    """What `--device auto` picks here: cuda when a GPU is visible, else cpu (`plan` sizes with it too)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device(auto_device_type())
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
    if name not in DTYPES:
        raise EaglewireError(f"--dtype {name!r}: expected one of auto, {', '.join(sorted(set(DTYPES)))}"
                             + did_you_mean(name, ["auto", *DTYPES]))
    return DTYPES[name]

