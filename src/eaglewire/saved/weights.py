"""Reading a foreign drafter's weights: safetensors everywhere, pickles only where the format has them.

Why so strict: a `pytorch_model.bin` is a pickle, and unpickling runs code.
The official EAGLE repository publishes pickles, so for that layout (and only
for it) they are read with `torch.load(weights_only=True)`, which refuses
anything but tensors and plain containers.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import inside
from eaglewire.saved.checkpoint import load_state

PICKLE_NAMES = ("pytorch_model.bin",)


def _sharded(src: Path) -> dict[str, torch.Tensor]:
    """Every file the index's weight_map names, each checked to lie inside `src` before it is opened."""
    idx = src / "model.safetensors.index.json"
    raw = read_json(idx, "no model.safetensors.index.json")
    wmap = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise EaglewireError(f"{idx}: weight_map missing, empty or not an object of tensor name -> file")
    # read-only, and HF-cache snapshots link every file to ../../blobs: the names are checked, links followed
    files = {v: inside(src, v, f"{idx}: weight_map[{k!r}]", symlinks=True) for k, v in wmap.items()}
    out: dict[str, torch.Tensor] = {}
    for name in sorted(files):
        out.update(load_state(files[name]))
    return out


def load_pickle_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise EaglewireError(f"{path}: not a plain tensor pickle (torch.load(weights_only=True) refused it: "
                             f"{str(e).splitlines()[0][:200]})") from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise EaglewireError(f"{path}: expected a dict of tensors (a state dict)")
    return dict(sd)


def read_weights(src: Path, fmt: str) -> tuple[dict[str, torch.Tensor], str]:
    """(state dict, file name) of a drafter directory in layout `fmt`."""
    if (src / "model.safetensors").is_file():
        return load_state(src / "model.safetensors"), "model.safetensors"
    if (src / "model.safetensors.index.json").is_file():
        return _sharded(src), "model.safetensors.index.json"
    for name in PICKLE_NAMES:
        if (src / name).is_file():
            if fmt != "eagle":
                raise EaglewireError(f"{src / name}: pickle weights are read only for the official EAGLE layout "
                                     f"(--format eagle); a {fmt} checkpoint must be safetensors")
            return load_pickle_weights(src / name), name
    raise EaglewireError(f"{src}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


# --- exported weights, checked in the type they are written as -----------------------------------------------

Q8_BLOCK = 32  # llama.cpp's q8_0: blocks of 32 values along a row, int8 each, scaled by an f16 max|x| / 127
NARROWED = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _unstorable(t: torch.Tensor, kind: str) -> str | None:
    """Why tensor `t` cannot be written as `kind` (f32, f16, bf16, q8_0), or None when it can."""
    t = t.detach()
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        return f"{bad} of its {t.numel()} values are not finite (NaN or inf) already"
    if kind == "q8_0" and t.shape[-1] % Q8_BLOCK == 0:
        scales = t.float().reshape(-1, Q8_BLOCK).abs().amax(dim=1) / 127
        if not bool(torch.isfinite(scales.to(torch.float16)).all()):
            return f"its largest value {t.abs().max().item():.4g} overflows q8_0's f16 block scale (max|x| / 127)"
        return None
    dtype = NARROWED.get(kind, torch.float16)  # a q8_0 row that is not whole blocks is written as f16
    if not bool(torch.isfinite(t.to(dtype)).all()):
        return (f"its largest value {t.abs().max().item():.4g} overflows {kind} (largest finite "
                f"{torch.finfo(dtype).max:.6g}): it would be written as inf")
    return None


def check_exported(tensors: dict[str, torch.Tensor], kind: str, where: str, narrowed_min_dims: int = 0) -> None:
    """Every floating tensor finite and within `kind`'s range, before anything is written: one line naming the
    tensor, the reason and a type that holds it. Tensors of fewer than `narrowed_min_dims` dimensions are written
    as f32 whatever `kind` (llama.cpp keeps 1-D tensors, the norms, in f32)."""
    for name, t in tensors.items():
        if not t.is_floating_point():
            continue
        this = kind if t.dim() >= narrowed_min_dims else "f32"
        why = _unstorable(t, this)
        if why is None:
            continue
        fits = [k for k in ("bf16", "f32") if k != this and _unstorable(t, k) is None]
        fix = (f"export with --gguf-type {' or '.join(fits)} (which hold{'s' if len(fits) == 1 else ''} them)"
               if fits and kind != "f32"
               else "the drafter's weights are damaged: retrain, or resume from an earlier checkpoint")
        raise EaglewireError(f"{where}: tensor {name} cannot be exported as {this}: {why}; {fix}")
