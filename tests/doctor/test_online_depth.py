"""`doctor online --depth`: the engine decodes at the depth the offline tau is computed at (both the one default)."""

from __future__ import annotations

import pytest

from eaglewire.doctor import inference
from eaglewire.doctor.config import DoctorOnlineConfig
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.saved.depth import DEPTH

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("depth", [None, 2])
def test_online_decodes_and_predicts_at_one_depth(tiny_drafter, tiny_targets, monkeypatch, depth):
    seen = {"engine": set(), "offline": set()}
    generate, stats = inference.SpecEngine.generate, inference.chain_stats

    def spy_generate(self, ids, cfg, *a, **k):
        seen["engine"].add(cfg.depth)
        return generate(self, ids, cfg, *a, **k)

    def spy_stats(model, ds, head, n, d, *a, **k):
        seen["offline"].add(d)
        return stats(model, ds, head, n, d, *a, **k)

    monkeypatch.setattr(inference.SpecEngine, "generate", spy_generate)
    monkeypatch.setattr(inference, "chain_stats", spy_stats)
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    kw = {} if depth is None else {"depth": depth}
    rep = inference.doctor_online(tiny_targets["llama"], model, prov, data, num_samples=1, max_new_tokens=8, **kw)
    want = DEPTH if depth is None else depth
    assert seen == {"engine": {want}, "offline": {want}} and rep.data["depth"] == want


def test_the_command_takes_depth_defaulting_to_the_one_default():
    assert DoctorOnlineConfig(drafter="d", data="x").depth == DEPTH
