"""Every size option of `train` is bounded before anything is allocated: one `error:` line naming the flag and
its range, never a ValueError or allocator traceback (issue 58)."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.manifest import Manifest
from eaglewire.drafter.config import BOUNDS, MAX_DRAFTER_LAYERS
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.targets.points import eagle3_default
from eaglewire.training import config as train_config
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import build_drafter
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("flag, value, bound", [
    ("--num-layers", 100000, "<= 64"), ("--intermediate-size", 10**9, "<= 10000000"),
    ("--ttt-steps", 10**6, "<= 64"), ("--seed", 10**30, "<= 4294967295"), ("--seed", -1, ">= 0"),
    ("--vocab-size", 10**12, "<= 10000000"), ("--batch-size", 10**12, "<= 1000000"),
    ("--grad-accum", 10**12, "<= 1000000"), ("--max-len", 10**30, "<= 1000000000"),
])
def test_a_size_out_of_range_is_one_line_naming_the_flag(tiny_dataset, tmp_path, flag, value, bound):
    r = run_cli("train", "--data", tiny_dataset, "--out", tmp_path / "run", "--device", "cpu", "--max-steps", 1, flag, value)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} {value}:") and bound in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_the_bounds_are_the_drafters_own():
    assert train_config.MAX_DRAFTER_LAYERS == MAX_DRAFTER_LAYERS == BOUNDS["num_layers"]
    assert train_config.MAX_WIDTH == BOUNDS["intermediate_size"] == BOUNDS["draft_vocab_size"]
    assert train_config.MAX_LEN == BOUNDS["max_position_embeddings"]


def test_a_drafter_the_config_refuses_is_one_line(tiny_targets, tmp_path):
    """A config built in code skips the flag check; the drafter's own bound is still an EaglewireError."""
    t = tiny_targets["llama"]
    man = Manifest(target=TargetRecord("tiny:llama", TargetFingerprint.of(t)), points=eagle3_default(t.num_layers),
                   num_slots=3)
    cfg = TrainConfig(data=tmp_path, out=tmp_path / "r", num_layers=MAX_DRAFTER_LAYERS + 1)
    with pytest.raises(EaglewireError, match=r"cannot build the drafter: field num_layers = 65: expected an integer"):
        build_drafter(cfg, t, man, torch.arange(64))
