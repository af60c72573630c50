"""Reading a foreign drafter's weights: safetensors everywhere, pickles only where the format has them.

Why so strict: a `pytorch_model.bin` is a pickle, and unpickling runs code.
The official EAGLE repository publishes pickles, so for that layout (and only
for it) they are read with `torch.load(weights_only=True)`, which refuses
anything but tensors and plain containers.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from eaglewire.export.checkpoint import load_state
from eaglewire.infra.errors import EaglewireError

PICKLE_NAMES = ("pytorch_model.bin",)


def _sharded(src: Path) -> dict[str, torch.Tensor]:
    idx = src / "model.safetensors.index.json"
    shards = sorted(set(json.loads(idx.read_text()).get("weight_map", {}).values()))
    if not shards:
        raise EaglewireError(f"{idx}: empty weight_map")
    out: dict[str, torch.Tensor] = {}
    for s in shards:
        out.update(load_state(src / s))
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
