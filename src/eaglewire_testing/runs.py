"""Comparing two training runs: their logged losses and their saved drafters (tests that train one way against
another, e.g. online against offline features)."""

from __future__ import annotations

import csv

import pytest
import torch

from eaglewire.saved.checkpoint import load_checkpoint


def metric_rows(out, split: str = "train") -> list[dict]:
    """The run's metrics.csv rows of one split."""
    with open(out / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == split]


def same_losses(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    """The same logged steps, losses within `rel` and first-step accuracies equal."""
    assert [x["step"] for x in a] == [x["step"] for x in b] and len(a) >= 1
    for x, y in zip(a, b):
        assert float(x["loss"]) == pytest.approx(float(y["loss"]), rel=rel), x["step"]
        assert float(x["acc_0"]) == pytest.approx(float(y["acc_0"]), abs=1e-9), x["step"]


def same_weights(da, db, atol: float = 2e-5):
    """Two saved drafters with the same tensors to `atol`; returns their provenances."""
    ma, pa = load_checkpoint(da)
    mb, pb = load_checkpoint(db)
    assert list(ma.state_dict()) == list(mb.state_dict())
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=atol, rtol=1e-4, msg=k)
    return pa, pb
