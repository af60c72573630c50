"""What generation and extraction do, as plain values: one source for the defaults.

The CLI options (``data/config.py``) take their defaults from here, and the
stage modules take these objects, so a default is written once. Kept free of
torch so that building the CLI stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 16
    seed: int = 0
    max_prompt_tokens: int = 1024

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ExtractSettings:
    points: list[str]
    dtype: str = "bf16"
    batch_tokens: int = 4096
    max_seq_len: int = 2048
    shard_samples: int = 256
