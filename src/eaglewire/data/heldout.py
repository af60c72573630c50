"""The shipped held-out prompt set: what every acceptance and speed figure is measured on."""

from __future__ import annotations

from pathlib import Path


def heldout_prompts_path() -> Path:
    """The shipped held-out prompt set: hand-written, never used to make training data."""
    return Path(__file__).resolve().parents[1] / "bench_prompts" / "heldout.jsonl"
