"""The target side of speculative decoding: KV cache, verify forward, selected-row logits.

WHY a runner instead of ``model(...)``: a verify forward needs (a) a tree
attention mask and tree position ids, (b) the captured features of every
verified token, (c) logits only at the few rows the acceptance walk visits
(the lm_head is the most expensive op of a small target), and (d) a cache
from which the rejected tree entries can be removed even when the accepted
path is not a contiguous tail (:meth:`keep`). The base model
(``model.model``) is called without the lm_head; :meth:`logits` applies the
head to the rows asked for through a oneDNN-prepacked weight.

Tree masks are passed to transformers as a 4D bool mask ``[1, 1, N, P+N]``
(True = may attend): ``create_causal_mask`` returns a 4D mask unchanged and
the sdpa / eager attention functions use it as-is (checked on llama, qwen3,
mistral and deepseek_v3/MLA in the tests). Because it is used as-is,
sliding-window layers get the window folded into their mask
(:func:`~eaglewire.targets.kvcache.window_masks`), and the cache keeps every row
of every layer so rejected drafts can be rolled back past the window.

Decode and verify calls (1..16 tokens) on Llama-family stacks in fp32 on CPU
take :class:`~eaglewire.targets.lean.LeanStack` instead of transformers'
forward (same cache, same captured points, equal to float rounding; about a
third less time per step); ``lean_why`` says why a runner does not. A
prompt (any causal call) takes it too, in 16-row chunks. Why: through
transformers a prompt's products run on oneDNN, which builds a primitive
for every new row count (a first prompt of a length paid 10-90 ms more on
the default target), and on MKL past 64 rows (a 72-token prompt 136 ms);
chunks through the kernel took 47 / 63 / 82 / 127 / 276 / 609 ms for 38 /
55 / 72 / 100 / 256 / 512 tokens against 51-89 / 60-72 / 136 / 142-234 /
402-459 / 749-1818 ms that way (one process, 2 threads, a Zen 5 VM).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from eaglewire.targets.capture import capturing, decoder_stack
from eaglewire.targets.fastlinear import FastLinear, packed_linears
from eaglewire.targets.kvcache import growing_cache, keep_rows, window_masks
from eaglewire.targets.lean import LeanStack, why_not_lean
from eaglewire.targets.points import Point
from eaglewire.targets.smallm import MAX_ROWS

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers' own switch (integrations/sdpa_attention.py)


@contextmanager
def sdpa_gqa(enabled: bool):
    """Grouped-query attention inside SDPA for masked multi-token calls, during one forward.

    WHY: with an attention mask and more than one query (every verify),
    transformers repeats the K/V cache to all query heads (``repeat_kv``),
    copying the whole cache in every layer: for SmolLM2's 3 KV heads and 9
    query heads that was 17% of a 4-token verify at a 200-token context, and
    grows with the context. torch's CPU SDPA takes the grouped heads directly
    (``enable_gqa``), bit-identical here; on CUDA transformers avoids it with a
    mask (the math fallback), so it is switched on for CPU calls only.
    """
    if not enabled:
        yield
        return
    before = os.environ.get(FORCE_GQA)
    os.environ[FORCE_GQA] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FORCE_GQA, None)
        else:
            os.environ[FORCE_GQA] = before


class TargetRunner:
    """One sequence (batch 1) decoded by the target with an in-place growing KV cache."""

    def __init__(self, target, points: list[Point] | None = None, fast: bool = True):
        self.target = target
        self.model = target.model
        self.base = decoder_stack(self.model)
        self.points = list(points or [])
        self.fast = fast
        head = self.model.get_output_embeddings()
        self.head = FastLinear(head.weight, head.bias) if fast else head
        self.softcap = getattr(self.model.config, "final_logit_softcapping", None)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        # decode / verify calls of 1..MAX_ROWS tokens take the lean forward where it applies (targets/lean.py)
        self.lean_why = "off (fast=False)" if not fast else why_not_lean(self.base, self.model.config)
        self._lean = None
        self._capture = {p.layer if p.kind == "layer" else p.kind: p.name for p in self.points}
        self.reset()

    def reset(self) -> None:
        self.cache = growing_cache(self.model.config, sliding=False)  # rollback needs full history

    @property
    def length(self) -> int:
        """Tokens whose KV is in the cache (= position of the next token)."""
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [1, N]
        position_ids: torch.Tensor | None = None,  # [1, N]; default: length .. length+N-1
        tree_mask: torch.Tensor | None = None,  # bool [N, N] ancestor-or-self; None = causal
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run N new tokens; return (post-norm hidden [1, N, H], features [1, N, A*H] or None)."""
        past, n = self.length, input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device)[None]
        allowed = None  # [N, P+N] True = may attend, before any sliding window
        if tree_mask is not None:
            prefix = torch.ones(n, past, dtype=torch.bool, device=input_ids.device)
            allowed = torch.cat([prefix, tree_mask.to(input_ids.device)], dim=1)
        if self.lean_why is None and (n <= MAX_ROWS or allowed is None):
            return self._lean_forward(input_ids, position_ids, allowed)
        mask = None
        if allowed is not None:
            k_pos = torch.cat([torch.arange(past, device=input_ids.device), position_ids[0]])  # [P+N]
            mask = window_masks(self.model.config, allowed[None, None], position_ids[0], k_pos)  # [1,1,N,P+N]
        with (capturing(self.model, self.points) as store, packed_linears(self.base, self.fast),
              sdpa_gqa(self.fast and input_ids.device.type == "cpu")):
            out = self.base(
                input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                cache=self.cache, use_cache=True,
            )
        return out.last_hidden_state, self._features(store)

    def _lean_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The lean stack on 1..MAX_ROWS rows, or a causal call of any length in MAX_ROWS-row chunks."""
        if self._lean is None:
            self._lean = LeanStack(self.base, self.model.config)
        outs, feats = [], []
        for i in range(0, input_ids.shape[1], MAX_ROWS):
            out, store = self._lean.forward(input_ids[:, i : i + MAX_ROWS], position_ids[:, i : i + MAX_ROWS],
                                            allowed, self.cache, self._capture)
            outs.append(out)
            feats.append(self._features(store))
        if len(outs) == 1:
            return outs[0], feats[0]
        return torch.cat(outs, 1), (None if feats[0] is None else torch.cat(feats, 1))  # [1, N, H], [1, N, A*H]

    def _features(self, store: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if not self.points:
            return None
        return torch.cat([store[p.name] for p in self.points], dim=-1)  # [1, N, A*H]

    @torch.inference_mode()
    def logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Full-vocab fp32 logits ``[M, V]`` for post-norm hidden rows ``[M, H]``."""
        z = self.head(hidden_rows).float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    @torch.inference_mode()  # the cache holds inference tensors, updated in place
    def keep(self, n_new: int, keep_idx: list[int]) -> None:
        """Drop rejected entries among the last ``n_new`` cache rows (``keep_idx`` ascending)."""
        keep_rows(self.cache, n_new, keep_idx)
