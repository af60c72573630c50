"""PEagleDrafter's parallel forward against a row-by-row incremental reference of vLLM's parallel round."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglewire.drafter import peagle as peagle_mod
from eaglewire.drafter.model import Eagle3Drafter
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire_testing.dflash import one_thread
from eaglewire_testing.drafters import HT, A, V, drafter_config

pytestmark = pytest.mark.unit
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
MASK = 7

VARIANTS = [{}, {"num_layers": 2, "fc_norm": True, "norm_before_residual": True},
            {"norm_before_fc": True, "norm_output": True}]


def model(seed: int = 0, **overrides) -> PEagleDrafter:
    """float64, with norm weights away from 1 (a norm left at 1 would hide a missing one)."""
    torch.manual_seed(seed)
    m = PEagleDrafter(drafter_config(**overrides), MASK).double()
    for p in m.parameters():
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    return m


def ref_fc(m: PEagleDrafter, x: torch.Tensor) -> torch.Tensor:
    """fc(norms(x)) for one fc input [A*Ht] written out: one RMSNorm over all of it, or one per slot, then the fc."""
    c = m.config
    x = x.reshape(-1)
    if c.norm_before_fc:
        x = m.input_norm.weight * x * torch.rsqrt(x.pow(2).mean() + c.rms_norm_eps)
    if c.fc_norm:
        s = x.view(c.num_aux, -1)
        x = m.fc_norm.weight * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)).reshape(-1)
    return F.linear(x, m.fc.weight)  # [H]


def incremental(m: PEagleDrafter, ids: list[int], feats: torch.Tensor, k: int) -> torch.Tensor:
    """The rows one at a time through ``step`` with the whole past as cache: real rows (x[t+1], fc(f[t])) at t,
    then mask rows at n .. n+k-2; logits of the last real row and the mask rows, [k, D]."""
    n = len(ids)
    rows = [(ids[t], ref_fc(m, feats[t]), t) for t in range(n)]
    rows += [(MASK, ref_fc(m, m.mask_hidden), n + j) for j in range(k - 1)]
    past, outs = None, []
    for tok, h, p in rows:
        one = torch.ones(1, 1, 1, 1 if past is None else past[0][0].shape[2] + 1, dtype=torch.bool)
        out, kv = m.step(torch.tensor([[tok]]), h.view(1, 1, -1), torch.tensor([[p]]), past, one)
        past = kv if past is None else [(torch.cat([a, c], 2), torch.cat([b, d], 2))
                                        for (a, b), (c, d) in zip(past, kv, strict=True)]
        outs.append(out[0, 0])
    return m.logits(torch.stack(outs[n - 1:]))


def inputs(n: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g).tolist(), torch.randn(n, A * HT, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("k", [1, 4])
def test_parallel_draft_equals_the_incremental_reference(overrides, k):
    """Two rounds: a prefix cached by the first call, then new rows + k-1 mask slots against that cache."""
    m = model(**overrides)
    ids, feats = inputs()
    with torch.no_grad():
        _, kv = m.parallel_draft(torch.tensor([ids[:4]]), feats[None, :4], torch.arange(4)[None], None, 3)
        got, new = m.parallel_draft(torch.tensor([ids[4:]]), feats[None, 4:], torch.arange(4, 6)[None], kv, k)
        want = incremental(m, ids, feats, k)
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)  # fc_norm computes in fp32 (SlotRMSNorm)
    assert [kk.shape[2] for kk, _ in new] == [2] * len(m.decoder_layers)  # the real rows only, never the masks


def _mask_slots_see_each_other(t, past=0, device=None):
    return torch.ones(1, 1, t, past + t, dtype=torch.bool)


def _constant_positions(real):
    def wrapped(self, input_ids, features, position_ids, k):
        ids, hidden, pos = real(self, input_ids, features, position_ids, k)
        pos = pos.clone()
        pos[:, input_ids.shape[1]:] = pos[:, input_ids.shape[1] - 1: input_ids.shape[1]]
        return ids, hidden, pos
    return wrapped


@pytest.mark.parametrize("bug", ["bidirectional", "constant-positions"])
def test_planted_bugs_are_caught(monkeypatch, bug):
    """The reference is sensitive: mask slots that see each other both ways (DFlash's rule), or that all sit at the
    last real position, change the drafts' logits."""
    m = model()
    ids, feats = inputs()
    with torch.no_grad():
        want = incremental(m, ids, feats, 4)
        if bug == "bidirectional":
            monkeypatch.setattr(peagle_mod, "causal_mask", _mask_slots_see_each_other)
        else:
            monkeypatch.setattr(PEagleDrafter, "parallel_inputs", _constant_positions(PEagleDrafter.parallel_inputs))
        got, _ = m.parallel_draft(torch.tensor([ids]), feats[None], torch.arange(6)[None], None, 4)
    assert (got[0, 1:] - want[1:]).abs().max() > 1e-4


def test_state_dict_is_eagle3_plus_mask_hidden():
    """The export path needs no new names: EAGLE-3's tensors, plus ``mask_hidden`` in speculators' [1, 1, A*Ht]
    (vLLM loads it with ``view(1, -1)`` into its fc-input-wide buffer)."""
    m = model()
    e3 = set(Eagle3Drafter(drafter_config()).state_dict())
    sd = m.state_dict()
    assert set(sd) - e3 == {"mask_hidden"} and e3 <= set(sd)
    assert tuple(sd["mask_hidden"].shape) == (1, 1, m.fc.in_features)
    assert m.mask_hidden.requires_grad and not m.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("bad", [-1, V, True, 3.0])
def test_mask_token_outside_the_vocabulary_is_refused(bad):
    with pytest.raises(ValueError, match=rf"mask_token_id = {bad!r}: expected .* \[0, {V - 1}\]"):
        PEagleDrafter(drafter_config(), bad)
