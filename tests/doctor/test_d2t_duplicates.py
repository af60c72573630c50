"""Issue 55: `doctor drafter` fails a d2t that maps two draft ids to one target id (it said "PASS d2t offsets")."""

from __future__ import annotations

import pytest
import torch

from eaglewire.doctor.drafter import doctor_drafter
from eaglewire.saved.checkpoint import load_checkpoint

pytestmark = pytest.mark.unit


def test_a_repeated_target_id_in_d2t_is_a_fail_line_naming_it(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    tgt = model.draft_target_ids()
    with torch.no_grad():
        model.d2t[5] = int(tgt[4]) - 5  # draft 5 -> draft 4's target id
    head = tiny_targets["llama"].model.get_output_embeddings().weight.float()
    rep = doctor_drafter(model, prov, data, head, num_samples=4)
    c = next(c for c in rep.checks if c.name == "d2t")
    assert rep.failed and not c.ok and f"target id {int(tgt[4])}" in c.detail
