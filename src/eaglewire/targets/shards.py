"""The frozen parts of a target that training needs, read from its shards by name; the target is never built.

Offline training uses the target's embedding (the drafter's frozen input and the fingerprint), its head
(the frozen teacher of the loss), its final norm (`--init head`) and at most one decoder layer (`--init
target`). Building the target to take those would hold all its weights on the host of every rank (a
Kimi-K2.5 is ~1 TB); reading the few tensors by name costs the embedding and the head. The model is
transformers' own class on the meta device (`load_skeleton`), so the config, the fingerprint and the
norm are the architecture's; the named tensors alone are made real. Wrapper prefixes come from
`families.shard_names`; a quantized checkpoint (`quantization_config`) keeps its embedding and head in
plain dtypes, which is all that is read from it unless a layer is asked for.
"""

from __future__ import annotations

import torch

from eaglewire.infra.atomic import read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.load import Target, load_skeleton, read_tensors


def load_frozen(source: str, layers: tuple[int, ...] = ()) -> Target:
    """The target as `load_skeleton` gives it, plus its head and those of the decoder `layers` listed that it
    has, read by name."""
    t = load_skeleton(source)
    lm = t.model
    if lm.get_output_embeddings().weight.is_meta:
        got = read_tensors(t.path, {"lm_head.weight": "lm_head.weight"})
        if "lm_head.weight" in got:
            w = got["lm_head.weight"].float()
        elif _tied(t):
            w = lm.get_input_embeddings().weight
        else:
            raise EaglewireError(f"target {source!r}: no lm_head.weight (under any wrapper's prefix) in "
                                 f"{t.path}/*.safetensors, and the config does not tie it to the embedding")
        lm.get_output_embeddings().weight = torch.nn.Parameter(w, requires_grad=False)
    for k in layers:
        if k < len(decoder_stack(lm).layers):  # one past the last: the warm start names that in its own words
            _materialize_layer(t, k)
    for p in lm.parameters():
        p.requires_grad_(False)
    return t


def _tied(t: Target) -> bool:
    """Whether the head is the embedding: the text config says so, or (a wrapper's text config has no such
    field: Qwen3-VL) the checkpoint's own config.json does."""
    tied = getattr(t.config, "tie_word_embeddings", None)
    if tied is None:
        tied = _raw_config(t).get("tie_word_embeddings")
    return bool(tied)


def _raw_config(t: Target) -> dict:
    raw = read_json(t.path / "config.json", "no config.json (not an HF model directory)")
    return raw if isinstance(raw, dict) else {}


def _materialize_layer(t: Target, k: int) -> None:
    stack = decoder_stack(t.model)
    if not 0 <= k < len(stack.layers):
        raise EaglewireError(f"target {t.source!r}: no decoder layer {k} (it has {len(stack.layers)})")
    layer = stack.layers[k]
    prefix = {id(m): n for n, m in t.model.named_modules()}[id(layer)]
    wanted = {f"{prefix}.{n}": f"{prefix}.{n}" for n, _ in layer.named_parameters()}
    got = read_tensors(t.path, wanted)
    if missing := sorted(set(wanted) - set(got)):
        why = (" (the checkpoint is quantized: its layers are not stored as plain weights)"
               if _raw_config(t).get("quantization_config") else
               " (a mixture of experts, stored per expert)" if ".experts." in missing[0] else "")
        raise EaglewireError(f"target {t.source!r}: layer {k}'s {missing[0]} is not in {t.path}/*.safetensors "
                             f"under that name{why}; use --init head")
    layer.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(got[f"{prefix}.{name}"].float())


def frozen_bytes(t: Target) -> int:
    """Bytes of the target's tensors made real (the rest stays on the meta device, costing nothing)."""
    seen: dict[int, int] = {}
    for x in (*t.model.parameters(), *t.model.buffers()):
        if not x.is_meta:
            seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
    return sum(seen.values())
