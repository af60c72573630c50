"""`eaglewire train --drafter p-eagle`: the EAGLE-3 loop (`loop.py`) with P-EAGLE's loss in place of TTT.

Why the EAGLE-3 loop and not a loop of its own (as DFlash has): a P-EAGLE drafter is an EAGLE-3 drafter
(`drafter/peagle.py`: the same tensors plus `mask_hidden`), so its draft vocabulary, warm starts, DDP/FSDP,
`--select loss`, run state and resume are EAGLE-3's unchanged. What differs, and lives here:

- the mask token id (the parallel slots' input token), resolved as DFlash resolves its own
  (`dflash_train.resolve_mask_token`), and refused when the dataset's answers hold it: a draft row reading
  that token as real input would stand for a mask slot;
- each step's COD elements (`peagle_loss.draw_elements`) are drawn before the forward, from a generator
  seeded by (seed, step, rank), so the step's loss can be normalised by the element count of the whole global
  batch (as `loop.py` normalises TTT by tokens) and a resumed run draws the same elements;
- the validation draws from one fixed generator, so every validation (and a re-run on the saved
  checkpoint) scores the same elements.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from safetensors import safe_open

from eaglewire.data.dataset import FeatureDataset
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.training.config import TrainConfig
from eaglewire.training.dflash_train import (
    loss_masks,
    resolve_mask_token,
    step_generator,
    used_token_ids,
)
from eaglewire.training.inputs import TrainInputs
from eaglewire.training.peagle_loss import (
    DOWN_SAMPLE_RATIO,
    DOWN_SAMPLE_RATIO_MIN,
    Elements,
    draw_elements,
    peagle_forward,
)
from eaglewire.training.precision import autocast, resolve_precision


def trained_depths(cfg: TrainConfig) -> int:
    """The positions a run scores per step (metrics.csv's acc_0..): P-EAGLE's parallel depths, else TTT's steps."""
    return cfg.parallel_depths if cfg.drafter == "p-eagle" else cfg.ttt_steps


def answer_token_ids(ds) -> set[int]:
    """Every token id at a loss-masked (answer) position of the data, read without the features."""
    if isinstance(ds, FeatureDataset):
        seen: set[int] = set()
        for s in ds.manifest.shards:
            with safe_open(str(ds.root / s["file"]), framework="pt") as f:
                seen.update(f.get_tensor("input_ids")[f.get_tensor("loss_mask").bool()].unique().tolist())
        return seen
    return {t for it in ds.items for t, m in zip(it[1], it[2]) if m}


def peagle_choices(cfg: TrainConfig, inputs: TrainInputs, train_idx: list[int]) -> tuple[int, dict]:
    """(mask token id, the record of the run's P-EAGLE choices for train.config.json and the checkpoint).

    Refuses, before anything is written, a mask id the answers hold and a split with nothing to train."""
    masks = loss_masks(inputs.ds)
    if not any(bool(masks[i][1:].any()) for i in train_idx):
        raise EaglewireError(f"{cfg.data}: no training sample has an answer token after its first token within "
                             f"--max-len {cfg.max_len} (the prompts fill it); raise --max-len")
    t = inputs.target
    rows = int(t.model.get_input_embeddings().weight.shape[0])
    mask, why = resolve_mask_token(cfg, t.tokenizer, rows, used_token_ids(inputs.ds))
    if mask in answer_token_ids(inputs.ds):
        raise EaglewireError(f"--mask-token-id {mask}: token {mask} occurs in the answers of {cfg.data}; the mask "
                             "slots need a token the drafter never reads as real input: pass another --mask-token-id "
                             "(-1 picks one absent from the data)")
    return mask, {"mask_token_id": mask, "mask_token_why": why, "depths": cfg.parallel_depths,
                  "down_sample_ratio": DOWN_SAMPLE_RATIO, "down_sample_ratio_min": DOWN_SAMPLE_RATIO_MIN,
                  "loss": "KL(target || draft) per COD element, no per-depth weight (speculators 0.9.0)"}


def element_generator(seed: int, step: int, rank: int = 0, split: str = "train") -> torch.Generator:
    """The COD draw's generator: a pure function of (seed, step, rank), so a resumed run draws the same elements.
    Validation uses step 0 at every validation: scores of one run compare on the same elements."""
    return step_generator(seed, step * 1024 + rank, split)


def draw(batches: list[dict], depths: int, gen: torch.Generator) -> list[Elements]:
    """One COD draw per collated micro-batch, in order from `gen`."""
    return [draw_elements(b["loss_mask"], b["attention_mask"], depths, generator=gen) for b in batches]


def step_elements(batches: list[dict], cfg: TrainConfig, step: int, dd) -> tuple[list, list, float] | None:
    """(micro-batches with a trained element, their draws, this rank's trained element count); None = skip the
    step: nothing to train, or (under torchrun) a rank with an empty micro-batch, which would break the ranks'
    lockstep of backward passes."""
    els = draw(batches, cfg.parallel_depths, element_generator(cfg.seed, step, dd.rank))
    keep = [j for j, e in enumerate(els) if e.trained]
    empty = float(dd.all_sum(torch.tensor(float(len(els) - len(keep)))))
    if not keep or (dd.world > 1 and empty > 0):
        return None
    return [batches[j] for j in keep], [els[j] for j in keep], float(sum(els[j].trained for j in keep))


def peagle_micro_loss(model, batch: dict, el: Elements, head_w: torch.Tensor, cfg: TrainConfig,
                      n_global: torch.Tensor, world: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """`model`: a drafter, or the (DDP-wrapped) `CallThrough` of one whose forward is `peagle_forward`.

    (loss to backward: KL sum / the global element count x world, as DDP averages over ranks; correct and
    counted elements per depth; the KL sum)."""
    fwd = functools.partial(peagle_forward, model) if isinstance(model, PEagleDrafter) else model
    el = Elements(*(getattr(el, f.name).to(device) for f in dataclasses.fields(el)))
    with autocast(resolve_precision(cfg.precision, device), device):
        out = fwd(batch["features"].to(device=device, dtype=torch.float32).flatten(2), batch["input_ids"].to(device),
                  batch["target_hidden"].to(device, torch.float32), head_w, batch["loss_mask"].to(device),
                  depths=cfg.parallel_depths, attention_mask=batch["attention_mask"].to(device),
                  target_argmax=batch["target_argmax"].to(device) if "target_argmax" in batch else None, elements=el)
    loss = out.kl_sum.float() * world / n_global.clamp(min=1)
    return loss, out.correct, out.count, float(out.kl_sum.detach())
