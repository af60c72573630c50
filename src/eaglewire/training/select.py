"""Which weights become the run's drafter: the last step's, the lowest validation loss's, or the highest
validation acceptance's.

SpecForge keeps the checkpoint with the best simulated acceptance length; speculators and ModelOpt keep the
best validation loss; a plain run keeps its last step. Loss and acceptance need not agree: the KL is spread
over the whole draft vocabulary and every TTT step, while acceptance only asks whether the argmax chain
matches. The score is counted on the run's validation split, which is neither trained on nor the shipped
held-out prompts, with the same chain walk `doctor drafter` and the held-out stage use (1 + accepted per
round, as vLLM reports it), so the held-out figure stays an unbiased measure of the selected drafter.

The best weights so far live in memory and, at each save, in state/best.safetensors, so a resumed run
selects over the whole run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglewire.decoding.acceptance import chain_stats
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_state

SELECT = ("last", "loss", "acceptance")


class Selector:
    """Scores each validation, keeps the best one's weights, and hands them to the checkpoint at the end."""

    def __init__(self, by: str, depth: int, ds, val_idx: list[int], head_w: torch.Tensor):
        if by not in SELECT:
            raise EaglewireError(f"--select {by!r}: expected one of {', '.join(SELECT)}")
        if by != "last" and not val_idx:
            raise EaglewireError(f"--select {by}: needs a validation split to select on (--val-fraction > 0)")
        self.by, self.depth, self.ds, self.val_idx, self.head_w = by, depth, ds, val_idx, head_w
        self.best: dict | None = None  # {"step", "score", "validation"} of the weights kept
        self.weights: dict[str, torch.Tensor] | None = None  # their state dict, on the CPU

    def acceptance(self, model) -> dict:
        """The validation split's chain walk at `depth` (mean acceptance length with its interval)."""
        was_training = model.training
        model.eval()
        try:
            s = chain_stats(model, self.ds, self.head_w, len(self.val_idx), self.depth, indices=self.val_idx)
        finally:
            model.train(was_training)
        return {"mean_acceptance_length": s["mean_acceptance_length"],
                "mean_acceptance_length_ci95": s["mean_acceptance_length_ci95"], "depth": self.depth}

    def consider(self, step: int, model, val: dict) -> None:
        """Keep these weights when they score best so far (ties keep the earlier, cheaper-to-reach ones)."""
        if self.by == "last":
            return
        score = val["mean_acceptance_length"] if self.by == "acceptance" else -val["loss"]
        if self.best is None or score > self.best["score"]:
            self.best = {"step": step, "score": score, "validation": dict(val)}
            self.weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def save(self, state_dir: Path) -> dict:
        """Writes the kept weights into a state directory being written; returns what meta.json records."""
        if self.weights is None:
            return {}
        save_file({k: v.contiguous() for k, v in self.weights.items()}, str(state_dir / "best.safetensors"))
        return {"best": self.best}

    def restore(self, state_dir: Path, meta: dict) -> None:
        """The kept weights of a resumed run (a run saved before any validation has none)."""
        best = meta.get("best")
        if best is None or self.by == "last":
            return
        if (not isinstance(best, dict) or not isinstance(best.get("step"), int)
                or not isinstance(best.get("score"), (int, float)) or not isinstance(best.get("validation"), dict)):
            raise EaglewireError(f"{state_dir / 'meta.json'}: field best = {best!r}: expected an object with an "
                                 "integer step, a numeric score and a validation object (the saved state is damaged; "
                                 "start a new --out)")
        self.best, self.weights = best, load_state(state_dir / "best.safetensors")

    def apply(self, model, last_step: int) -> dict:
        """Loads the kept weights into `model`; returns the record for the drafter's provenance (`last`: the
        model is left as it is)."""
        if self.by == "last" or self.weights is None:  # no validation ran in this process nor was one saved
            return {"by": "last", "step": last_step}
        model.load_state_dict(self.weights, strict=True)
        return {"by": self.by, "step": self.best["step"], "score": self.best["score"],
                **({"depth": self.depth} if self.by == "acceptance" else {})}
