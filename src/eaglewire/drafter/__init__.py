"""EAGLE-3 draft model: config, model code and training-time test (TTT).

May import: targets.
"""

from eaglewire.drafter.config import DrafterConfig
from eaglewire.drafter.model import Eagle3Drafter, causal_mask
from eaglewire.drafter.ttt import (
    TTTOutput,
    prepare_targets,
    target_full_argmax,
    ttt_attention_mask,
    ttt_forward,
    ttt_forward_naive,
)

__all__ = [
    "DrafterConfig",
    "Eagle3Drafter",
    "TTTOutput",
    "causal_mask",
    "prepare_targets",
    "target_full_argmax",
    "ttt_attention_mask",
    "ttt_forward",
    "ttt_forward_naive",
]
