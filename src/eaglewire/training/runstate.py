"""What a training run keeps in its directory besides the drafter: metrics and the resumable state.

metrics.csv is truncated to the resumed step, so a resumed run shows one
clean trajectory; state/ is written whole-or-nothing (`atomic_dir`), so a run
killed while saving resumes from the previous save.
"""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.tensorboard import SummaryWriter

from eaglewire.export.checkpoint import load_state
from eaglewire.infra.atomic import atomic_dir, read_json
from eaglewire.infra.errors import EaglewireError


class MetricsLog:
    """metrics.csv (truncated to the resumed step, so a resumed run has one clean trajectory) + TensorBoard."""

    def __init__(self, out: Path, k: int, resume_step: int | None, enabled: bool):
        self.enabled = enabled
        self.path = out / "metrics.csv"
        self.fields = ["split", "step", "epoch", "loss", *[f"acc_{j}" for j in range(k)], "lr", "tokens_per_s", "grad_norm"]
        if not enabled:
            return
        rows = []
        if resume_step is not None and self.path.exists():
            with open(self.path) as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, self.fields)
            w.writeheader()
            w.writerows(rows)

        self.tb = SummaryWriter(str(out / "tb"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields).writerow({k: row.get(k, "") for k in self.fields})
        for k, v in row.items():
            if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                self.tb.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def close(self):
        if self.enabled:
            self.tb.close()


def save_state(out: Path, model, opt, step: int, extra: dict) -> None:
    with atomic_dir(out / "state") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, **extra}))


def load_run_state(out: Path, model, opt) -> dict:
    st = out / "state"
    if not (st / "meta.json").is_file():
        raise EaglewireError(f"{out}: --resume but no saved state in {st}")
    model.load_state_dict(load_state(st / "model.safetensors"), strict=True)
    try:
        # weights_only: tensors and plain containers only; anything else (a pickled object) is refused
        opt.load_state_dict(torch.load(st / "optimizer.pt", weights_only=True))
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError) as e:
        raise EaglewireError(f"{st / 'optimizer.pt'}: not an optimizer state eaglewire wrote (refused: "
                             f"{str(e).splitlines()[0][:160]}); start a new --out or remove {st}") from e
    return read_json(st / "meta.json", "no meta.json")
