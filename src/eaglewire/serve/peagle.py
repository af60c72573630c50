"""`eaglewire serve` for a P-EAGLE drafter: vLLM's `eagle3` method with `parallel_drafting`, checked against
eaglewire's parallel engine.

vLLM 0.32.0 serves the `vllm`-format export (the EAGLE-3 layout plus
`mask_hidden` and a top-level `mask_token_id`, export/peagle_io.py) with
`--speculative-config '{"method": "eagle3", ..., "parallel_drafting": true}'`
(saved/peagle.py `vllm_speculative_config`): one drafter forward per round,
K drafts, counted with the same counters as EAGLE-3 (every round drafts K;
accepted drafts counted up to the tokens the request kept). The check before
"ready" is `doctor live` with decoding/peagle.py's `ParallelEngine` as the
prediction, counted the same way. Without `parallel_drafting` vLLM drafts
sequentially from hidden states the drafter was never trained to read; the
serve test measures that as its negative control.

SGLang 0.5.23 and llama.cpp have no P-EAGLE: both are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from eaglewire.export.peagle_io import peagle_entry
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.depth import resolved_depth

__all__ = ["is_peagle_checkpoint", "peagle_depth", "refuse_engine"]


def is_peagle_checkpoint(ckpt: Path) -> bool:
    return peagle_entry(ckpt) is not None


def peagle_depth(depth: int, ckpt: Path) -> int:
    """Drafts per round (vLLM num_speculative_tokens): --depth when given, else the depths it was trained for."""
    return resolved_depth(depth, peagle_entry(ckpt)["depths"])


def refuse_engine(engine: str, ckpt: Path) -> None:
    """One line for an engine that has no P-EAGLE (neither SGLang 0.5.23 nor llama.cpp drafts in parallel)."""
    if engine != "vllm":
        raise EaglewireError(f"{ckpt}: a P-EAGLE drafter; {engine} has no parallel EAGLE drafting (it would serve "
                             "another drafter): serve it with --engine vllm (vLLM >= 0.32, parallel_drafting)")
