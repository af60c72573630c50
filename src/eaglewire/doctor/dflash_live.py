"""`doctor live`'s prediction for a DFlash drafter: block decoding instead of the EAGLE-3 chain.

A DFlash server drafts K mask slots in one forward per round (vLLM 0.32.0
`v1/spec_decode/dflash.py`, K = `num_speculative_tokens`) and counts
acceptance with the same method-agnostic counters as EAGLE-3
(`v1/spec_decode/metrics.py`), so everything `doctor live` compares stays;
only what a correctly wired server accepts must come from eaglewire's block
engine (decoding/dflash.py), run at the server's K. Its rounds carry the
same `(drafted, accepted)` records as the chain engine's, so
`predicted_acceptance` reads them unchanged.
"""

from __future__ import annotations

from pathlib import Path

from eaglewire.decoding.dflash import BlockEngine
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import is_dflash_checkpoint, load_dflash_checkpoint
from eaglewire.targets.points import Point

__all__ = ["DFlashPrediction", "dflash_prediction_for", "is_dflash_checkpoint", "refuse_dflash"]


class DFlashPrediction:
    """The interface `doctor live` asks of its engine (`encode`, `generate(ids, SpecConfig)`), on a DFlash drafter."""

    method = "dflash"  # vLLM's speculative method, SGLang's algorithm, llama.cpp's --spec-type draft-dflash

    def __init__(self, target, drafter) -> None:
        self.target = target
        self.block = BlockEngine(target, drafter)

    def encode(self, prompt, chat: bool = True) -> list[int]:
        return SpecEngine.encode(self, prompt, chat)  # reads only self.target: the same chat rendering as EAGLE-3

    def generate(self, prompt_ids: list[int], cfg: SpecConfig):
        if cfg.min_prob:
            raise EaglewireError(f"--p-min {cfg.min_prob:g}: eaglewire's DFlash prediction does not gate its block "
                                 "(llama.cpp's --spec-draft-p-min along the slots is not modelled): check a server "
                                 "started with --spec-draft-p-min 0, or pass --p-min 0")
        return self.block.generate(prompt_ids, cfg)


def dflash_prediction_for(target, ckpt: Path) -> tuple[DFlashPrediction, list[Point]]:
    """(the prediction engine, the points the drafter was trained on); a drafter for another target is one line."""
    drafter, prov = load_dflash_checkpoint(ckpt, device=target.device, dtype=target.dtype)
    c = drafter.config
    bad = [f"{what} {mine} (target: {theirs})" for what, mine, theirs in (
        ("hidden size", c.hidden_size, target.hidden_size), ("vocabulary", c.vocab_size, target.vocab_size))
        if mine != theirs]
    deepest = max(k for k in c.target_layer_ids)
    if deepest >= target.num_layers:
        bad.append(f"target_layer_ids {list(c.target_layer_ids)} (target: {target.num_layers} layers)")
    if prov.num_layers is not None and prov.num_layers != target.num_layers:
        bad.append(f"trained on a {prov.num_layers}-layer target (target: {target.num_layers} layers)")
    if bad:
        raise EaglewireError(f"DFlash drafter {ckpt} does not fit target {target.source!r}: {'; '.join(bad)} "
                             "(pass the target it was trained for with --target)")
    return DFlashPrediction(target, drafter), c.points


def refuse_dflash(ckpt: Path, command: str, instead: str) -> None:
    """One line for the doctor commands that replay EAGLE-3 chains, naming what checks a DFlash drafter."""
    if is_dflash_checkpoint(ckpt):
        raise EaglewireError(f"{ckpt}: a DFlash drafter; `doctor {command}` replays EAGLE-3 chains and does not "
                             f"read it: {instead}")
