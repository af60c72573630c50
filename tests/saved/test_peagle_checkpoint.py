"""The P-EAGLE checkpoint: an EAGLE-3 checkpoint plus mask_hidden and the eaglewire_peagle key, loaded as a
PEagleDrafter that drafts as the saved one did; strict, one line for each way it can be damaged."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import WEIGHTS, load_checkpoint, save_checkpoint
from eaglewire.saved.peagle import PEAGLE_KEY
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.export_helpers import L, make_drafter, provenance

pytestmark = pytest.mark.unit
MASK = 96  # the last row of export_helpers' 97-token vocabulary


def peagle(seed: int = 0) -> PEagleDrafter:
    """export_helpers' random EAGLE-3 drafter (a draft vocabulary of 40) as a P-EAGLE one, mask_hidden random."""
    e3 = make_drafter(seed)
    m = PEagleDrafter(e3.config, MASK)
    m.load_state_dict({**e3.state_dict(), "mask_hidden": torch.randn(1, 1, e3.fc.in_features)}, strict=True)
    return m.eval()


def save(path, m, depths=4):
    return save_checkpoint(path, m, provenance([p.name for p in eagle3_default(L)], L), depths=depths)


def drafts(m: PEagleDrafter) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(1, 5, m.fc.in_features, generator=g)
    ids = torch.randint(0, 97, (1, 5), generator=g)
    with torch.no_grad():
        return m.parallel_draft(ids, feats, torch.arange(5)[None], None, 3)[0]


def test_round_trip_loads_a_peagle_drafter(tmp_path):
    m = peagle()
    d = save(tmp_path / "ck", m)
    assert json.loads((d / "config.json").read_text())[PEAGLE_KEY] == {"mask_token_id": MASK, "depths": 4}
    assert "mask_hidden" in load_file(str(d / WEIGHTS))
    got, _ = load_checkpoint(d)
    assert isinstance(got, PEagleDrafter) and got.mask_token_id == MASK
    assert torch.equal(got.mask_hidden, m.mask_hidden)
    assert torch.equal(drafts(got), drafts(m))  # the parallel slots draft as the saved drafter's


def test_plain_eagle3_checkpoint_stays_eagle3(tmp_path):
    d = save_checkpoint(tmp_path / "e3", make_drafter(), provenance([p.name for p in eagle3_default(L)], L))
    assert PEAGLE_KEY not in json.loads((d / "config.json").read_text())
    assert not isinstance(load_checkpoint(d)[0], PEagleDrafter)


def _edit(d, config=None, drop=None, add=None):
    if config is not None:
        raw = json.loads((d / "config.json").read_text())
        config(raw)
        (d / "config.json").write_text(json.dumps(raw))
    if drop or add:
        sd = load_file(str(d / WEIGHTS))
        sd = {k: v for k, v in sd.items() if k != drop} | (add or {})
        save_file(sd, str(d / WEIGHTS))


@pytest.mark.parametrize("damage,message", [
    (dict(drop="mask_hidden"), r"tensors do not match the config: missing \['mask_hidden'\], unexpected none"),
    (dict(config=lambda r: r.pop(PEAGLE_KEY)), r"missing none, unexpected \['mask_hidden'\]"),
    (dict(config=lambda r: r[PEAGLE_KEY].update(mask_token_id=97)), rf"{PEAGLE_KEY}: P-EAGLE mask_token_id = 97"),
    (dict(config=lambda r: r[PEAGLE_KEY].update(mask_token_id="7")), rf"{PEAGLE_KEY}.mask_token_id = '7'"),
    (dict(config=lambda r: r[PEAGLE_KEY].update(depths=0)), rf"{PEAGLE_KEY}.depths = 0: expected an integer >= 1"),
    (dict(config=lambda r: r.update({PEAGLE_KEY: [1]})), rf"{PEAGLE_KEY} is \[1\]: expected an object"),
    (dict(add={"mask_hidden": torch.zeros(1, 1, 5)}), r"mask_hidden has shape \[1, 1, 5\], config implies \[1, 1, 96\]"),
])
def test_damaged_checkpoint_is_one_line(tmp_path, damage, message):
    d = save(tmp_path / "ck", peagle())
    _edit(d, **damage)
    with pytest.raises(EaglewireError, match=message) as e:
        load_checkpoint(d)
    assert "\n" not in str(e.value)
    assert str(d) in str(e.value)


def test_depths_must_be_positive(tmp_path):
    with pytest.raises(EaglewireError, match="depths = 0"):
        save(tmp_path / "ck", peagle(), depths=0)
    assert not (tmp_path / "ck").exists()
