"""P-EAGLE: an EAGLE-3 drafter that drafts its K positions in one forward.

Why a subclass and not a new model: the drafter is EAGLE-3's (same fc, same
layers, same head, same state-dict names), trained so that its later draft
positions need no fed-back hidden state. What it adds is one tensor,
``mask_hidden`` (``[1, 1, A*Ht]``, the fc's input width), which stands for the
target features a not-yet-drafted position does not have, and a mask token
id (a row of the frozen target embedding). speculators 0.9.0
``models/peagle/core.py`` ``PEagleDraftModel`` and vLLM 0.32.0
``model_executor/models/llama_eagle3.py`` (``mask_hidden``, loaded with
``view(1, -1)``, so the speculators shape ``[1, 1, A*Ht]`` loads as is) agree
on both; docs/parallel-drafters.md section 8 cites the rest.

A round, as vLLM's V1 proposer builds it (``v1/spec_decode/llm_base_proposer.py``
with ``parallel_drafting``, ``copy_and_expand_eagle_inputs``): the rows the
target has just verified, ``(x[t+1], fc(f[t]))`` at rope position ``t`` (the
EAGLE-3 shift, the last one carrying the bonus token), then ``K-1`` slots
``(mask id, fc(mask_hidden))`` at the next positions, all causal against the
drafter's cache. The K drafts are read at the last real row and at the
``K-1`` mask rows: draft ``j`` (0-based) predicts ``x[t_last + 2 + j]``.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglewire.drafter.config import DrafterConfig
from eaglewire.drafter.model import KV, Eagle3Drafter, causal_mask


class PEagleDrafter(Eagle3Drafter):
    """:class:`Eagle3Drafter` plus ``mask_hidden`` and the mask token id its parallel slots read."""

    def __init__(self, config: DrafterConfig, mask_token_id: int) -> None:
        super().__init__(config)
        if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) \
                or not 0 <= mask_token_id < config.vocab_size:
            raise ValueError(f"P-EAGLE mask_token_id = {mask_token_id!r}: expected a row of the target "
                             f"embedding, an integer in [0, {config.vocab_size - 1}]")
        self.mask_token_id = mask_token_id
        # speculators initialises it with randn (PEagleDraftModel.__init__); it is trained like any weight
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, config.num_aux * config.target_hidden_size))

    def mask_input(self) -> torch.Tensor:
        """The drafter-side hidden of every mask slot, ``[1, 1, H]``: ``mask_hidden`` through the fc input norms
        and the fc, as vLLM's ``combine_hidden_states`` does once at load time."""
        return self.project(self.mask_hidden)

    def parallel_inputs(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                        k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of one parallel forward: the T real rows, then ``k-1`` mask slots after the last position.

        input_ids [B, T] (``x[t+1]``), features [B, T, A*Ht] (``f[t]``), position_ids [B|1, T] (``t``) ->
        ids [B, T+k-1], hidden [B, T+k-1, H], positions [B, T+k-1].
        """
        if k < 1 or input_ids.shape[1] < 1:
            raise ValueError(f"P-EAGLE draft: expected k >= 1 and at least one real row "
                             f"(got k={k}, {input_ids.shape[1]} rows)")
        b = input_ids.shape[0]
        hidden = self.project(features)  # [B, T, H]
        pos = position_ids.expand(b, -1)
        if k == 1:
            return input_ids, hidden, pos
        m = k - 1
        ids = torch.cat([input_ids, input_ids.new_full((b, m), self.mask_token_id)], 1)  # [B, T+m]
        hidden = torch.cat([hidden, self.mask_input().to(hidden.dtype).expand(b, m, -1)], 1)  # [B, T+m, H]
        after = pos[:, -1:] + torch.arange(1, k, device=pos.device)[None]  # [B, m]
        return ids, hidden, torch.cat([pos, after], 1)

    def parallel_draft(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                       past_kv: list[KV] | None, k: int) -> tuple[torch.Tensor, list[KV]]:
        """One forward: draft-vocab logits ``[B, k, D]`` of the k drafts, and the per-layer K/V of the T real rows.

        ``past_kv`` holds the drafter's entries of the positions before ``position_ids`` (real rows only: a
        round's mask slots are never cached, they are rebuilt after the next verify, as in vLLM).
        """
        t = input_ids.shape[1]
        ids, hidden, pos = self.parallel_inputs(input_ids, features, position_ids, k)
        past = 0 if past_kv is None else past_kv[0][0].shape[2]
        mask = causal_mask(ids.shape[1], past, device=ids.device)  # [1, 1, T+k-1, past+T+k-1]
        out, new_kv = self.step(ids, hidden, pos, past_kv, mask)  # [B, T+k-1, H]
        logits = self.logits(out[:, t - 1:])  # [B, k, D]: last real row, then the mask rows
        return logits, [(kk[:, :, :t], vv[:, :, :t]) for kk, vv in new_kv]
