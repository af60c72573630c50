"""A KV cache that grows in place instead of concatenating every step.

WHY: transformers' ``DynamicLayer.update`` is ``torch.cat([keys, new])``, which
copies the whole cache on every decode step, so a long generation does
quadratic work in memory traffic (measured effect on batched answer
generation: ``benchmarks/README.md``). :class:`GrowingLayer` keeps a buffer with spare
capacity (doubling when full) and exposes ``keys``/``values`` as views of its
first ``n`` positions: appending writes only the new rows.

Anything that replaces ``keys`` with a tensor that is not such a view (crop
keeps the view; ``index_select`` in the spec engine's rollback, beam search's
reorder) is detected on the next update and adopted as the new buffer, so
the layer stays correct under every cache operation transformers performs.
Sliding-window layers: for batched generation they are left as transformers
builds them (they drop old rows; nothing is ever rolled back). The spec
engine asks for full history instead (``sliding=False``): a window layer that
has dropped rows cannot roll back rejected drafts, so every layer keeps all
rows and the window is applied by the attention mask (transformers' own
sliding mask on the plain and chain paths, :func:`window_masks` on the tree
path).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from eaglewire.targets.smallm import smallm_kernel


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose appends write into preallocated capacity."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = None

    def _is_view(self) -> bool:
        """True when keys/values are the leading positions of the buffers."""
        b = self._kbuf
        return (
            b is not None and self.keys is not None and self.keys.dim() == 4
            and self.keys.data_ptr() == b.data_ptr() and self.keys.shape[:2] == b.shape[:2]
            and self.keys.stride() == b.stride() and self.values.data_ptr() == self._vbuf.data_ptr()
        )

    def _reserve(self, n_old: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Make the buffers hold n_old + new positions, keeping the first n_old."""
        cap = 0 if self._kbuf is None else self._kbuf.shape[-2]
        n = n_old + k_new.shape[-2]
        if cap >= n:
            return
        B, Hk, _, D = k_new.shape
        new_cap = max(2 * n, 64)
        kb = k_new.new_empty(B, Hk, new_cap, D)  # [B, Hk, cap, D]
        vb = v_new.new_empty(B, Hk, new_cap, v_new.shape[-1])  # [B, Hk, cap, Dv]
        if n_old:
            kb[:, :, :n_old].copy_(self.keys)
            vb[:, :, :n_old].copy_(self.values)
        self._kbuf, self._vbuf = kb, vb

    def room(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(rows held, K buffer, V buffer) with capacity for ``key_states``' rows after them; a writer
        (``update``, or the lean forward's C++ layer) fills them and then calls :meth:`grow`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n_old = self.keys.shape[-2] if self.keys is not None and self.keys.dim() == 4 else 0
        if n_old and not self._is_view():
            self._kbuf = self._vbuf = None  # keys were replaced: adopt them on the copy below
        self._reserve(n_old, key_states, value_states)
        return n_old, self._kbuf, self._vbuf

    def grow(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expose the first ``n`` buffered rows as keys / values."""
        self.keys, self.values = self._kbuf.narrow(2, 0, n), self._vbuf.narrow(2, 0, n)  # [B, Hk, n, D]
        return self.keys, self.values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n_old, kb, vb = self.room(key_states, value_states)
        n = n_old + key_states.shape[-2]
        kb[:, :, n_old:n].copy_(key_states)
        vb[:, :, n_old:n].copy_(value_states)
        return self.grow(n)

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


def growing_cache(config, sliding: bool = True) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers grow in place.

    ``sliding=False`` replaces sliding-window layers too (full history, the
    window left to the mask), for decoding that rolls the cache back.
    """
    cache = DynamicCache(config=config)
    swap = (DynamicLayer,) if sliding else (DynamicLayer, DynamicSlidingWindowLayer)
    cache.layers = [GrowingLayer() if type(layer) in swap else layer for layer in cache.layers]
    return cache


def window_masks(config, mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """The attention mask(s) to pass for an explicit 4D ``mask`` [1, 1, N, K] (True = attend).

    transformers uses a 4D mask as given, so a sliding-window layer would see
    past its window; here each window layer gets ``mask & (q - k < window)``
    (transformers' convention), from the query positions ``q_pos`` [N] and key
    positions ``k_pos`` [K]. Models with per-layer types get the dict keyed by
    layer type that their forward accepts; a model with one window for every
    layer (Mistral) gets the windowed tensor.
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"layer types {sorted(unknown)}: tree verification supports full and sliding attention")
        if "sliding_attention" not in types:
            return mask
    if not window:
        return mask
    near = (q_pos[:, None] - k_pos[None, :]) < window  # [N, K]
    windowed = mask & near[None, None]  # [1, 1, N, K]
    if types:
        return {"full_attention": mask, "sliding_attention": windowed}
    return windowed


def keep_rows(cache, n_new: int, keep_idx: list[int]) -> None:
    """Keep only ``keep_idx`` (ascending indices) among the last ``n_new`` positions of every layer.

    A contiguous head of the block is a crop; anything else (a tree path that
    skips rejected siblings) gathers the kept rows. Growing layers gather in
    place, so the next append does not reallocate.
    """
    drop = n_new - len(keep_idx)
    if keep_idx == list(range(len(keep_idx))):
        if drop:
            cache.crop(-drop)
        return
    first = next(i for i, k in enumerate(keep_idx) if k != i)  # rows before it are in place already
    if _move_in_place(cache, n_new, keep_idx, first):
        return
    sources: dict[tuple, torch.Tensor] = {}  # one index tensor per (past, device), not one per layer
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if not getattr(layer, "is_initialized", True) or keys is None or not keys.numel():
            continue
        past = keys.shape[-2] - n_new
        key = (past, keys.device)
        if key not in sources:
            sources[key] = torch.tensor([past + i for i in keep_idx], device=keys.device)
        src = sources[key]
        n = past + len(keep_idx)
        if isinstance(layer, GrowingLayer) and layer._is_view():
            layer._kbuf[:, :, past + first:n] = layer._kbuf.index_select(-2, src[first:])
            layer._vbuf[:, :, past + first:n] = layer._vbuf.index_select(-2, src[first:])
            layer.keys, layer.values = layer._kbuf[:, :, :n], layer._vbuf[:, :, :n]
        else:
            idx = torch.cat([torch.arange(past, device=keys.device), src])
            layer.keys = keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)


def _move_in_place(cache, n_new: int, keep_idx: list[int], first: int) -> bool:
    """:func:`keep_rows` as one C++ call over every layer's buffers (False: not applicable here, nothing done).

    Applies when every layer is a :class:`GrowingLayer` whose keys/values are views of its CPU buffers with
    the same length, and the thin-matrix kernel was built (targets/smallm.py)."""
    kernel = smallm_kernel()
    layers = cache.layers
    if kernel is None or not hasattr(kernel, "move_rows") or not layers:
        return False
    if not all(type(layer) is GrowingLayer and layer.is_initialized and layer._is_view() for layer in layers):
        return False
    lengths = {layer.keys.shape[-2] for layer in layers}
    bufs = [b for layer in layers for b in (layer._kbuf, layer._vbuf)]
    if len(lengths) != 1 or any(b.device.type != "cpu" or not b.is_contiguous() for b in bufs):
        return False
    past = lengths.pop() - n_new
    kernel.move_rows(bufs, past, keep_idx, first)
    for layer in layers:
        layer.grow(past + len(keep_idx))
    return True
