"""`eaglewire export` of P-EAGLE drafters: the EAGLE-3 export plus ``mask_hidden`` and the mask token id.

Why a file of its own: the ids, tensors and checks are the EAGLE-3 export's
(exporter.py), so that path runs unchanged and this file only says which
formats can carry a P-EAGLE drafter and what they add (saved/peagle.py).
vLLM 0.32.0 reads the ``vllm`` layout with a top-level ``mask_token_id``
when served with ``parallel_drafting: true``, and the speculators ``peagle``
layout by itself. SGLang 0.5.23 has no P-EAGLE (no ``peagle``,
``mask_hidden`` or parallel EAGLE drafting in the wheel), nor has llama.cpp
(its vendored source, ``engines/llama_env.source_dir()``, has no
``mask_hidden`` nor parallel drafting), and the official EAGLE code drafts
sequentially: those formats would serve another drafter, so they are refused.
"""

from __future__ import annotations

from pathlib import Path

from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import resolve_dir
from eaglewire.saved.peagle import (
    MASK_HIDDEN,
    read_peagle,
    speculators_peagle_config,
    vllm_peagle_config,
)

FORMATS = ("vllm", "speculators")  # the layouts an engine serves as P-EAGLE (vLLM 0.32.0)
_WHY = {"sglang": "SGLang 0.5.23 has no P-EAGLE (no parallel EAGLE drafting, no mask_hidden)",
        "eagle": "the official EAGLE code drafts sequentially and has no mask_hidden",
        "gguf": "llama.cpp has no P-EAGLE (no mask_hidden, no parallel drafting in its source)"}


def peagle_entry(ckpt: Path) -> dict | None:
    """The checkpoint's P-EAGLE entry (mask id, depths), or None for any other checkpoint (or an unreadable
    config.json, which the EAGLE-3 loader then names)."""
    p = resolve_dir(Path(ckpt)) / "config.json"
    if not p.is_file():
        return None
    try:
        raw = read_json(p, "no config.json")
    except EaglewireError:
        return None
    return read_peagle(raw, p) if isinstance(raw, dict) else None


def refuse_format(ckpt, fmt: str) -> None:
    """One line for a format that cannot carry a P-EAGLE drafter, before anything is read or written."""
    f = fmt.lower()
    f = {"llama.cpp": "gguf", "specforge": "sglang", "official": "eagle"}.get(f, f)
    if f not in FORMATS:
        why = _WHY.get(f, f"unknown format {fmt!r}")
        raise EaglewireError(f"{ckpt}: a P-EAGLE drafter exports to {' or '.join(FORMATS)} only (--format {fmt}: "
                             f"{why})")


def peagle_outputs(fmt: str, model: PEagleDrafter, config: dict, tensors: dict, k: int) -> tuple[dict, dict]:
    """(config, tensors) of the export: the EAGLE-3 ones plus the P-EAGLE keys and ``mask_hidden``; ``k`` is the
    drafts per round the speculators layout records (`--depth`, resolved by saved/depth.py's `resolved_depth`)."""
    if MASK_HIDDEN not in tensors:
        raise EaglewireError(f"P-EAGLE export: the state dict has no {MASK_HIDDEN} (not a P-EAGLE drafter)")
    if fmt == "vllm":
        return vllm_peagle_config(config, model.mask_token_id), tensors  # full-vocab d2t dropped by formats
    return speculators_peagle_config(config, model.mask_token_id, k), tensors
