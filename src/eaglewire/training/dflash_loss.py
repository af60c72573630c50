"""DFlash training: anchors, multi-block batches, the slot-decayed block loss.

Follows SpecForge a6b6b02 ``specforge/algorithms/common/dflash_family_model.py``
(``_sample_anchor_positions``, ``_create_noise_embed``, ``_create_position_ids``,
``create_dflash_block_mask``, ``_dflash_objective_chunk_terms``) and, for the
soft-target variant, speculators 0.9.0 ``models/dflash/core.py``
(``_backbone_forward``: the verifier's distribution at ``a+k-1``).

Why one forward for many blocks: every anchor of a sequence shares the same
context K/V (computed once for all T positions), and the mask of
:func:`block_mask` makes the result equal to running each block alone at
inference (``block`` with the context sliced to ``< a``), which the tests
check. The dense mask is ``(N*B) x (T+N*B)`` per sequence, hence the bound on
anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.infra.errors import EaglewireError

# ModelOpt examples/speculative_decoding/doc/dflash.md quoting the DFlash paper (arXiv 2602.06036): gamma 7 for
# B=16, 4 for B=8; SpecForge's qwen3-8b-dflash-online.yaml uses 7.0 at B=16, speculators 4.0 by default.
PAPER_GAMMA = {16: 7.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """The paper's gamma for B = 8 and 16; other sizes on the line through those two (1 + 3B/8).

    The line is eaglewire's choice, not an upstream value: it keeps the weight of the last slot, exp(-(B-2)/gamma),
    near the paper's (B=16: e^-2; B=8: e^-1.5; B=4: e^-0.8)."""
    return PAPER_GAMMA.get(block_size, 1.0 + 3.0 * block_size / 8.0)


def slot_weights(block_size: int, gamma: float | None, device=None) -> torch.Tensor:
    """``[B]``: 0 for slot 0 (the known bonus), ``exp(-(k-1)/gamma)`` for slot k >= 1 (``gamma=None``: no decay)."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.ones(block_size, device=device) if gamma is None else torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, block_size: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, up to ``num_anchors`` positions ``a`` with ``loss_mask[a]`` and room for a whole block
    (``a <= T - block_size``), uniformly without replacement, sorted (SpecForge ``OnlineDFlashModel.
    _sample_anchor_positions``; its extra ``- 1`` on the count is not kept: a sequence with one candidate trains).

    Returns ``(anchors [B, N], keep [B, N])``; rows with fewer candidates are padded with anchor 0, keep False.
    """
    lm = loss_mask.bool()
    cand = lm[:, : max(lm.shape[1] - block_size + 1, 0)]  # [B, T-Bk+1]
    bsz = lm.shape[0]
    n = min(num_anchors, int(cand.sum(1).max())) if cand.numel() else 0
    if n <= 0:
        empty = torch.zeros(bsz, 0, dtype=torch.long, device=lm.device)
        return empty, empty.bool()
    noise = torch.rand(cand.shape, generator=generator) if generator is not None else torch.rand_like(cand.float())
    noise = noise.to(cand.device).masked_fill(~cand, 2.0)  # non-candidates sort last
    order = noise.argsort(dim=1)[:, :n]  # [B, N]
    ok = torch.gather(cand, 1, order)
    picked = torch.where(ok, order, torch.full_like(order, cand.shape[1] + 1))
    picked, idx = picked.sort(dim=1)
    keep = torch.gather(ok, 1, idx)
    return torch.where(keep, picked, torch.zeros_like(picked)), keep


@dataclass
class Blocks:
    """N blocks per sequence laid out as ``N*B`` queries."""

    tokens: torch.Tensor  # [B, N*Bk] [x[a], MASK ...] per block
    positions: torch.Tensor  # [B, N*Bk] a .. a+Bk-1
    labels: torch.Tensor  # [B, N*Bk] x[a+k] (clamped inside the sequence; weight 0 past it)
    weights: torch.Tensor  # [B, N*Bk] slot decay * loss_mask[a+k] * (a+k < T) * keep
    label_pos: torch.Tensor  # [B, N*Bk] a+k clamped to T-1 (soft targets read a+k-1)
    mask: torch.Tensor  # bool [B, 1, N*Bk, T+N*Bk]


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor,
                 block_size: int, mask_token_id: int, gamma: float | None,
                 attention_mask: torch.Tensor | None = None) -> Blocks:
    """Blocks, labels, weights and the attention mask for anchors ``[B, N]`` over a batch ``[B, T]``."""
    bsz, t = input_ids.shape
    dev = input_ids.device
    n = anchors.shape[1]
    k = torch.arange(block_size, device=dev)
    pos = (anchors[:, :, None] + k).reshape(bsz, n * block_size)  # [B, N*Bk]
    inside = pos < t
    label_pos = pos.clamp(max=t - 1)
    labels = torch.gather(input_ids, 1, label_pos)
    tokens = torch.full_like(labels, mask_token_id).view(bsz, n, block_size)
    tokens[:, :, 0] = torch.gather(input_ids, 1, anchors)
    w = slot_weights(block_size, gamma, dev).repeat(n)[None]  # [1, N*Bk]
    w = w * torch.gather(loss_mask.float(), 1, label_pos) * inside * keep.repeat_interleave(block_size, 1)
    return Blocks(tokens.view(bsz, -1), pos, labels, w, label_pos,
                  block_mask(anchors, t, block_size, attention_mask))


def block_mask(anchors: torch.Tensor, t: int, block_size: int,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """bool ``[B, 1, N*Bk, T+N*Bk]``: block n sees context keys ``< a_n`` (the anchor's own state does not exist
    at inference) and its own block both ways, nothing of other blocks (SpecForge ``create_dflash_block_mask``)."""
    bsz, n = anchors.shape
    dev = anchors.device
    q_anchor = anchors.repeat_interleave(block_size, 1)  # [B, N*Bk]
    ctx = torch.arange(t, device=dev)[None, None, :] < q_anchor[:, :, None]  # [B, N*Bk, T]
    if attention_mask is not None:
        ctx = ctx & attention_mask.bool()[:, None, :]
    blk = torch.arange(n, device=dev).repeat_interleave(block_size)  # [N*Bk]
    own = (blk[:, None] == blk[None, :]).expand(bsz, -1, -1)  # [B, N*Bk, N*Bk]
    return torch.cat([ctx, own], dim=2)[:, None]


@dataclass
class DFlashOutput:
    loss: torch.Tensor  # scalar, weighted mean over slots
    correct: torch.Tensor  # [Bk-1] weighted-in slots whose argmax is the label, per slot 1..Bk-1
    count: torch.Tensor  # [Bk-1] slots counted

    @property
    def acc(self) -> list[float]:
        return (self.correct / self.count.clamp_min(1)).tolist()


def dflash_forward(
    model: DFlashDrafter,
    features: torch.Tensor,  # [B, T, A*H] captured target states at the config's ids
    input_ids: torch.Tensor,  # [B, T]
    embed_weight: torch.Tensor,  # [V, H] the target's (frozen) input embedding
    head_weight: torch.Tensor,  # [V, H] the target's (frozen) lm_head
    loss_mask: torch.Tensor,  # [B, T]
    num_anchors: int = 64,
    gamma: float | None = None,  # None: default_gamma(block_size)
    decay: bool = True,  # False: every slot 1..Bk-1 weighs 1
    attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token, right padding
    target_hidden: torch.Tensor | None = None,  # [B, T, H] final post-norm target states: soft targets
    generator: torch.Generator | None = None,
) -> DFlashOutput:
    """One step's loss: anchors drawn anew, every block in one drafter forward.

    A batch with no anchor (no loss position with room for a block) is refused: its loss would be 0/0.

    Hard targets (SpecForge): cross-entropy against the data token ``x[a+k]``. With ``target_hidden``
    (speculators, ModelOpt's self-distillation): cross-entropy against the target's distribution at
    ``a+k-1``, which is what the target would have predicted for ``a+k``.
    """
    c = model.config
    bk = c.block_size
    gamma = (gamma or default_gamma(bk)) if decay else None
    anchors, keep = sample_anchors(loss_mask, num_anchors, bk, generator)
    if not keep.any():
        raise EaglewireError(f"DFlash batch: no loss-masked position with room for a block of {bk} "
                             f"(sequences of {input_ids.shape[1]} tokens)")
    b = build_blocks(input_ids, loss_mask, anchors, keep, bk, c.mask_token_id, gamma, attention_mask)
    t = input_ids.shape[1]
    ctx = model.context_kv(features, torch.arange(t, device=input_ids.device)[None])
    embeds = F.embedding(b.tokens, embed_weight).to(features.dtype)  # [B, N*Bk, H]
    hidden = model.block(embeds, b.positions, ctx, b.mask)  # [B, N*Bk, H]
    wide = torch.promote_types(hidden.dtype, torch.float32)  # softmax in fp32 at least (bf16 training)
    logits = (hidden @ head_weight.to(hidden.dtype).T).to(wide)  # [B, N*Bk, V]
    logp = logits.log_softmax(-1)
    if target_hidden is None:
        nll = -logp.gather(-1, b.labels[..., None])[..., 0]  # [B, N*Bk]
    else:
        prev = (b.label_pos - 1).clamp(min=0)
        th = torch.gather(target_hidden, 1, prev[..., None].expand(-1, -1, target_hidden.shape[-1]))
        with torch.no_grad():
            p = (th @ head_weight.to(th.dtype).T).to(wide).softmax(-1)  # [B, N*Bk, V]
        nll = -(p * logp).sum(-1)
    w = b.weights
    loss = (nll * w).sum() / w.sum().clamp_min(1e-8)
    hit = (logits.argmax(-1) == b.labels) & (w > 0)
    counted = (w > 0).view(*w.shape[:1], -1, bk)[..., 1:]  # [B, N, Bk-1]
    correct = hit.view(*w.shape[:1], -1, bk)[..., 1:].sum((0, 1)).float()
    return DFlashOutput(loss, correct, counted.sum((0, 1)).float())
