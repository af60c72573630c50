"""P-EAGLE training: COD sampling, the rollout mask, the KL loss; one drafter forward per batch.

Follows speculators 0.9.0 ``models/peagle/`` (``data.py``
``generate_cod_sample_indices``, ``attention.py`` ``create_peagle_mask_mod``,
``core.py`` ``PEagleDraftModel.forward``, ``metrics.py`` ``compute_metrics``
with ``losses/utils.py`` ``loss_function`` and the default ``kl_div``);
SpecForge ``specforge/core/peagle.py`` ``OnlinePEagleModel`` is the same
algorithm. Indices are eaglewire's TTT convention (``drafter/ttt.py``), which
is speculators' after its ``shift_batch``:

    element (a, d)   anchor a (a draft row, 0 <= a <= T-2), depth d (0 .. depths-1)
    input            d == 0: (x[a+1], fc(f[a]))     d > 0: (mask id, fc(mask_hidden))
    rope position    a + d
    target           p[a+d+1], the target's distribution at a+d+1 (over the draft vocab)
    weight           loss_mask[a+d+1] * attention_mask[a+d+1]

Why one forward: every element is a row of one ``step`` call whose mask lets
``(a, d)`` see the depth-0 rows of anchors ``<= a`` and the rows ``(a, 1..d)``
of its own rollout (:func:`peagle_mask`), which is what the inference forward
of ``drafter/peagle.py`` computes for the draft ``d`` of a round whose last
real row is ``a`` (the tests check it element by element). Depth 0 has every
anchor; depth d keeps a random ``max(r^d, r_min)`` share of the trainable ones
whose depth d-1 was kept (COD), which bounds the rows at about ``(1 + sum_d
max(r^d, r_min)) * T`` instead of ``depths * T``.

The loss is speculators': KL(target || draft) per element, no per-depth weight
(the deeper depths weigh less only because COD keeps fewer of them), averaged
over all trainable elements of the batch (speculators packs a batch into one
row and averages over it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.drafter.ttt import prepare_targets
from eaglewire.infra.errors import EaglewireError

# speculators 0.9.0 train/config/schema.py PEagleArgs; examples/train/peagle_qwen3_8b_sharegpt_online_5k.sh
# trains num_depths 4 with these ratios
DOWN_SAMPLE_RATIO, DOWN_SAMPLE_RATIO_MIN = 0.7, 0.2


def cod_sample(trainable: torch.Tensor, depths: int, ratio: float = DOWN_SAMPLE_RATIO,
               ratio_min: float = DOWN_SAMPLE_RATIO_MIN, max_anchors: int | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """COD elements of one sequence: ``(anchor [N], depth [N])``, depth 0 first (every row), then depth 1, ...

    ``trainable`` [n] bool: row j's target (position j+1) is trained. A depth-d element sits at row ``j = a+d``
    with ``trainable[j]``; its depth d-1 element (row j-1, same anchor) was kept. Per depth, ``int((s - d) *
    max(ratio**d, ratio_min))`` of the candidates are kept, s the number of seeds (trainable rows, at most
    ``max_anchors`` of them), as ``generate_cod_sample_indices`` does. Its depth-1 candidates include row 0,
    whose anchor would be -1; here they start at row 1.
    """
    n = trainable.shape[0]
    dev = trainable.device
    seeds = torch.nonzero(trainable).flatten()
    if max_anchors is not None and seeds.numel() > max_anchors:
        seeds = seeds[torch.randperm(seeds.numel(), generator=generator)[:max_anchors].to(dev)].sort().values
    anchors, levels = [torch.arange(n, device=dev)], [torch.zeros(n, dtype=torch.long, device=dev)]
    cand = seeds[seeds >= 1]
    for d in range(1, depths):
        size = int(max(0, seeds.numel() - d) * max(ratio**d, ratio_min))
        if size <= 0 or cand.numel() == 0:
            break
        if cand.numel() >= size:  # equal: all of them, but the draw is made (the same random stream)
            cand = cand[torch.randperm(cand.numel(), generator=generator)[:size].to(dev)].sort().values
        anchors.append(cand - d)
        levels.append(torch.full_like(cand, d))
        nxt = cand + 1
        nxt = nxt[nxt < n]
        cand = nxt[trainable[nxt]]
    return torch.cat(anchors), torch.cat(levels)


def peagle_mask(anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, N, N]``: ``(a, d)`` sees the depth-0 rows of anchors ``<= a`` and ``(a, d' <= d)``
    (speculators ``create_peagle_mask_mod``); padding elements (``real`` False) see only themselves."""
    qa, ka = anchor[:, :, None], anchor[:, None, :]
    qd, kd = depth[:, :, None], depth[:, None, :]
    see = ((kd == 0) & (ka <= qa)) | ((ka == qa) & (kd <= qd))
    see = see & real[:, None, :] & real[:, :, None]
    return (see | torch.eye(anchor.shape[1], dtype=torch.bool, device=anchor.device))[:, None]


@dataclass
class PEagleOutput:
    loss: torch.Tensor  # scalar, mean KL over the trainable elements
    kl_sum: torch.Tensor  # scalar, their sum (what a loop normalising over several micro-batches adds up)
    correct: torch.Tensor  # [depths] trainable elements whose draft argmax is the target's (full-vocab) argmax
    count: torch.Tensor  # [depths] trainable elements per depth

    @property
    def acc(self) -> list[float]:
        return (self.correct / self.count.clamp_min(1)).tolist()


@dataclass
class Elements:
    """One COD draw for a batch, right-padded to one length N per row."""

    anchor: torch.Tensor  # [B, N] long
    depth: torch.Tensor  # [B, N] long
    real: torch.Tensor  # [B, N] bool, False = padding
    weight: torch.Tensor  # [B, N] bool, real and its target position trained

    @property
    def trained(self) -> int:
        """Elements in the loss: the denominator of this batch's mean."""
        return int(self.weight.sum())


def _trainable(loss_mask: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    return loss_mask.bool() if attention_mask is None else loss_mask.bool() & attention_mask.bool()


def draw_elements(loss_mask: torch.Tensor, attention_mask: torch.Tensor | None = None, depths: int = 4,
                  ratio: float = DOWN_SAMPLE_RATIO, ratio_min: float = DOWN_SAMPLE_RATIO_MIN,
                  max_anchors: int | None = None, generator: torch.Generator | None = None) -> Elements:
    """COD per sequence of a ``[B, T]`` batch (row j's target is position j+1), padded to one length.

    Drawn before the forward when a loop needs the batch's element count first (:attr:`Elements.trained`)."""
    keep = _trainable(loss_mask, attention_mask)
    per = [cod_sample(row, depths, ratio, ratio_min, max_anchors, generator) for row in keep[:, 1:]]
    width = max(a.numel() for a, _ in per)
    anchor = keep.new_zeros((len(per), width), dtype=torch.long)
    depth = torch.zeros_like(anchor)
    real = torch.zeros_like(anchor, dtype=torch.bool)
    for i, (a, d) in enumerate(per):
        anchor[i, : a.numel()], depth[i, : a.numel()], real[i, : a.numel()] = a, d, True
    return Elements(anchor, depth, real, real & torch.gather(keep, 1, anchor + depth + 1))


def peagle_forward(
    model: PEagleDrafter,
    features: torch.Tensor,  # [B, T, A*Ht] captured target states at the drafter's points
    input_ids: torch.Tensor,  # [B, T]
    target_hidden: torch.Tensor,  # [B, T, Ht] final post-norm target states (the soft targets)
    head_weight: torch.Tensor,  # [V, Ht] the target's (frozen) lm_head
    loss_mask: torch.Tensor,  # [B, T]
    depths: int = 4,
    down_sample_ratio: float = DOWN_SAMPLE_RATIO,
    down_sample_ratio_min: float = DOWN_SAMPLE_RATIO_MIN,
    max_anchors: int | None = None,  # speculators' max_anchors (512 there): seeds per sequence
    attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token, right padding
    target_argmax: torch.Tensor | None = None,  # [B, T] precomputed full-vocab argmax, else computed
    generator: torch.Generator | None = None,
    elements: Elements | None = None,  # a draw made beforehand with the same depths (draw_elements); else here
) -> PEagleOutput:
    """One step's loss: COD elements drawn anew (or given), every element in one drafter forward.

    A batch with no trainable element (no loss position after the first token) is refused: its loss would be 0/0.
    """
    bsz, t = input_ids.shape
    if depths < 1 or t < 2:
        raise EaglewireError(f"P-EAGLE batch: expected depths >= 1 and sequences of at least 2 tokens "
                             f"(got depths {depths}, {t} tokens)")
    keep = _trainable(loss_mask, attention_mask)
    if not keep[:, 1:].any():
        raise EaglewireError(f"P-EAGLE batch: no loss-masked position after the first token "
                             f"(sequences of {t} tokens)")
    el = elements if elements is not None else draw_elements(loss_mask, attention_mask, depths, down_sample_ratio,
                                                             down_sample_ratio_min, max_anchors, generator)
    anchor, depth, w = el.anchor, el.depth, el.weight
    row = anchor + depth  # [B, N] the element's row; its target sits at row + 1
    ids = torch.where(depth == 0, torch.gather(input_ids, 1, anchor + 1),
                      torch.full_like(anchor, model.mask_token_id))
    proj = model.project(features)  # [B, T, H]
    hid = torch.gather(proj, 1, anchor[..., None].expand(-1, -1, proj.shape[-1]))
    hid = torch.where((depth == 0)[..., None], hid, model.mask_input().to(hid.dtype))  # [B, N, H]
    out, _ = model.step(ids, hid, row, None, peagle_mask(anchor, depth, el.real))  # [B, N, H]
    tg = prepare_targets(model, target_hidden, head_weight, keep, torch.ones_like(keep), target_argmax)
    s = row + 1
    bi = torch.arange(bsz, device=s.device)[:, None].expand_as(s)[w]
    logq = model.logits(out[w]).to(tg.probs.dtype).log_softmax(-1)  # [M, D]
    p = tg.probs[bi, s[w]]  # [M, D]
    kl = (p * (p.clamp_min(1e-30).log() - logq)).sum(-1)  # [M]
    with torch.no_grad():
        hit = model.draft_to_target(logq.argmax(-1)) == tg.argmax[bi, s[w]]
        d = depth[w]
        correct = torch.zeros(depths, device=s.device).index_add_(0, d, hit.float())
        count = torch.zeros(depths, device=s.device).index_add_(0, d, torch.ones_like(hit, dtype=torch.float))
    return PEagleOutput(kl.sum() / w.sum(), kl.sum(), correct, count)
