"""What every training loop (EAGLE-3's `loop.py`, DFlash's `dflash_train.py`) reads a run by: the split, the
order of samples, the learning-rate schedule, the skipped-step rule and the test hooks. One home, so both
drafters train from the same split and schedule and a resume reads them the same way."""

from __future__ import annotations

import math
import os
import time

import torch

from eaglewire.infra.errors import EaglewireError
from eaglewire.training.config import TrainConfig

_STEP_DELAY = float(os.environ.get("EAGLEWIRE_STEP_DELAY", "0"))  # lets crash tests kill a real run
# lets resume tests stop a real run (torchrun's ranks too) right after its save at this step, as a kill would
_STOP_AFTER = int(os.environ.get("EAGLEWIRE_STOP_AFTER", "0"))


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed + 7919)
    perm = torch.randperm(n, generator=g).tolist()
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 and n > 1 else 0
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def lr_at(step: int, cfg: TrainConfig, total: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def global_batch(train_idx: list[int], step: int, per_step: int, seed: int) -> list[int]:
    """Sample ids of optimizer step `step`: a seeded permutation per epoch, read in order."""
    per_epoch = max(1, len(train_idx) // per_step)
    epoch, k = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(len(train_idx), generator=g).tolist()
    return [train_idx[i] for i in perm[k * per_step:(k + 1) * per_step]]


def finite_batch(batch: dict) -> bool:
    return bool(torch.isfinite(batch["features"]).all() and torch.isfinite(batch["target_hidden"]).all())


def check_skipped(cfg: TrainConfig, skipped: int, total: int) -> None:
    """A run that trained on (almost) nothing must not end as a success with a drafter written."""
    if skipped >= total:  # total >= 1: run_train refuses a run of no steps up front
        raise EaglewireError(f"{cfg.data}: no optimizer step was taken ({skipped} of {total} steps skipped for "
                             "non-finite features or gradients); no drafter written")
    if skipped / total > cfg.max_skipped_fraction:
        raise EaglewireError(f"{cfg.data}: {skipped} of {total} steps were skipped for non-finite features or gradients "
                             f"(more than --max-skipped-fraction {cfg.max_skipped_fraction}); no drafter written. "
                             "Check the dataset with `eaglewire doctor dataset`")


def stop_hooks(step: int) -> None:
    """After step `step`'s save: the test hooks every training loop honours."""
    if step + 1 == _STOP_AFTER:
        raise SystemExit(f"stopped after step {step + 1} (EAGLEWIRE_STOP_AFTER)")
    if _STEP_DELAY:
        time.sleep(_STEP_DELAY)
