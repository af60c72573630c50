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

from eaglewire.export.checkpoint import load_state
from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import inside

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
