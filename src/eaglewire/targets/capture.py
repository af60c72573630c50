"""Capture physically named target tensors in one forward pass.

Hooks sit on the embedding, on the decoder layers that are asked for and on
the final norm, so memory grows with the number of points, not with the depth
(unlike `output_hidden_states`, which keeps all L+1 and adds ~40 ms per step
on the default target). The same hooks serve dataset extraction and online
decoding, so training and inference read the tensors from the same place.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from eaglewire.targets.points import Point


def decoder_stack(model) -> torch.nn.Module:
    """The decoder stack of a causal LM: the module with ``embed_tokens``, ``layers`` and ``norm``, without lm_head.

    Capture hooks, the verify forward, warm starts and imports all reach into
    it, so they find it one way. transformers' ``get_decoder`` returns
    ``model.model`` for every *ForCausalLM and the model itself for a bare
    decoder (both tested on every tiny architecture).
    """
    dec = model.get_decoder()
    if not hasattr(dec, "layers") and hasattr(getattr(dec, "model", None), "layers"):
        return dec.model  # Llama-4's causal LM answers get_decoder() with itself
    return dec


def hook_module(model, point: Point) -> torch.nn.Module:
    base = decoder_stack(model)
    if point.kind == "embed":
        return base.embed_tokens
    if point.kind == "final_norm":
        return base.norm
    return base.layers[point.layer]


@contextmanager
def capturing(model, points: list[Point], history: bool = False):
    """Yield a dict filled with {point name: tensor [B, T, H]} by each forward inside; with `history`,
    {point name: [tensor per forward]} (batched generation keeps every step, data/gencapture.py)."""
    store: dict = {}
    handles = []
    for p in points:
        def hook(_mod, _args, out, name=p.name):
            got = out[0] if isinstance(out, tuple) else out  # [B, T, H]
            if history:
                store.setdefault(name, []).append(got)
            else:
                store[name] = got
        handles.append(hook_module(model, p).register_forward_hook(hook))
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def capture(model, input_ids: torch.Tensor, points: list[Point],
            attention_mask: torch.Tensor | None = None,
            position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Run the base model (no lm_head) once and return the requested points.

    Padding must be on the right, or `position_ids` must be given: a plain
    forward numbers positions 0..T-1 regardless of the mask.
    """
    with capturing(model, points) as store, torch.no_grad():
        decoder_stack(model)(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=False)
    return {p.name: store[p.name] for p in points}
