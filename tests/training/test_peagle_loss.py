"""P-EAGLE training: COD sampling and the rollout mask as speculators 0.9.0 computes them, and the one-forward loss
equal to a per-element loop over the inference forward of drafter/peagle.py."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.training import peagle_loss
from eaglewire.training.peagle_loss import cod_sample, draw_elements, peagle_forward, peagle_mask
from eaglewire_testing.ci import cannot_run
from eaglewire_testing.dflash import one_thread
from eaglewire_testing.drafters import HT, A, V, drafter_config, make_batch
from eaglewire_testing.speculators_venv import venv_dir

# unit tests, except the two that run speculators' own code (conftest marks the unmarked ones unit)
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
MASK = 7


def model(seed: int = 0, **overrides) -> PEagleDrafter:
    torch.manual_seed(seed)
    m = PEagleDrafter(drafter_config(**overrides), MASK).double()
    g = torch.Generator().manual_seed(seed + 1)
    m.load_target_embedding(torch.randn(V, m.config.hidden_size, generator=g, dtype=torch.float64))
    m.set_draft_vocab(torch.sort(torch.randperm(V, generator=g)[: m.config.draft_vocab_size]).values)
    return m


def batch(t: int = 12) -> dict:
    b = make_batch(t=t)
    b["head_weight"] = b.pop("target_head_weight")
    return b


def naive(m: PEagleDrafter, b: dict, elements) -> tuple[torch.Tensor, list[int], list[int]]:
    """Per element (a, d): a fresh ``parallel_draft`` over rows 0..a of its sequence with k = d+1, draft d read;
    KL against the target's softmax at a+d+1 over the draft columns of the full-vocab logits."""
    anchor, depth, real = elements.anchor, elements.depth, elements.real
    ids, feats, th, head = b["input_ids"], b["features"], b["target_hidden"], b["head_weight"]
    keep = b["loss_mask"].bool() & b["attention_mask"].bool()
    total, n, correct, count = 0.0, 0, [0] * 4, [0] * 4
    for i in range(ids.shape[0]):
        for a, d, r in zip(anchor[i].tolist(), depth[i].tolist(), real[i].tolist(), strict=True):
            s = a + d + 1
            if not (r and keep[i, s]):
                continue
            logits, _ = m.parallel_draft(ids[i: i + 1, 1: a + 2], feats[i: i + 1, : a + 1], torch.arange(a + 1)[None],
                                         None, d + 1)
            logq = logits[0, d].log_softmax(-1)
            full = th[i, s] @ head.T  # [V]
            p = full[m.t2d].softmax(-1)
            total = total + (p * (p.log() - logq)).sum()
            n += 1
            count[d] += 1
            correct[d] += int(m.draft_to_target(logq.argmax()) == full.argmax())
    return total / n, correct, count


def _grads(m, loss):
    m.zero_grad(set_to_none=True)
    loss.backward()
    return {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("overrides", [{}, {"num_layers": 2, "norm_before_fc": True, "norm_output": True}])
def test_one_forward_equals_each_element_drafted_alone(overrides):
    """Same COD draw on both sides (same seed); loss, per-depth accuracy and gradients agree."""
    m, b = model(**overrides), batch()
    fast = peagle_forward(m, **b, depths=4, generator=torch.Generator().manual_seed(3))
    el = draw_elements(b["loss_mask"], b["attention_mask"], 4, generator=torch.Generator().manual_seed(3))
    assert set(el.depth[el.real].tolist()) == {0, 1, 2, 3}  # every depth is exercised
    slow, correct, count = naive(m, b, el)
    torch.testing.assert_close(fast.loss, slow, rtol=1e-6, atol=1e-9)
    assert fast.count.tolist() == count and fast.correct.tolist() == correct and el.trained == sum(count)
    torch.testing.assert_close(fast.kl_sum, slow * el.trained, rtol=1e-6, atol=1e-9)
    given = peagle_forward(m, **b, depths=4, elements=el)  # a draw made beforehand: the same loss
    torch.testing.assert_close(given.loss, fast.loss, rtol=0, atol=0)
    gf, gs = _grads(m, fast.loss), _grads(m, slow)
    assert set(gf) == set(gs) and "mask_hidden" in gf and "embed_tokens.weight" not in gf
    for k in gf:
        torch.testing.assert_close(gf[k], gs[k], rtol=1e-5, atol=1e-7, msg=k)  # input_norm runs in fp32


def _sees_other_rollouts(anchor, depth, real):
    """Bug: a mask row also sees the earlier anchors' mask rows of lower depth."""
    good = peagle_mask(anchor, depth, real)
    extra = (anchor[:, None, :] < anchor[:, :, None]) & (depth[:, None, :] <= depth[:, :, None])
    return good | (extra & real[:, None, :])[:, None]


def _misses_its_own_context(anchor, depth, real):
    """Bug: depth-0 rows are seen strictly before the anchor (its own last real row left out)."""
    good = peagle_mask(anchor, depth, real)
    own0 = (depth[:, None, :] == 0) & (anchor[:, None, :] == anchor[:, :, None]) & (depth[:, :, None] > 0)
    return good & ~own0[:, None]


@pytest.mark.parametrize("bug", [_sees_other_rollouts, _misses_its_own_context])
def test_planted_mask_bugs_are_caught(monkeypatch, bug):
    m, b = model(), batch()
    el = draw_elements(b["loss_mask"], b["attention_mask"], 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        slow, _, _ = naive(m, b, el)
        monkeypatch.setattr(peagle_loss, "peagle_mask", bug)
        bad = peagle_forward(m, **b, depths=4, generator=torch.Generator().manual_seed(3))
    assert abs(float(bad.loss - slow)) > 1e-4


def test_cod_invariants():
    """Depth 0 = every row; a depth-d element is a trainable row whose depth d-1 element (same anchor) was kept;
    per depth, int((seeds - d) * max(0.7^d, 0.2)) of the candidates."""
    g = torch.Generator().manual_seed(0)
    tr = torch.rand(60, generator=g) > 0.3
    tr[0] = True  # row 0 is never a depth-1 element: its anchor would be -1
    anchor, depth = cod_sample(tr, 6, generator=g)
    seeds = int(tr.sum())
    assert torch.equal(anchor[depth == 0], torch.arange(60))
    kept = {(a, d) for a, d in zip(anchor.tolist(), depth.tolist(), strict=True)}
    for a, d in kept:
        assert a >= 0 and (d == 0 or (tr[a + d] and (a, d - 1) in kept))
    for d in range(1, 6):
        assert int((depth == d).sum()) <= int((seeds - d) * max(0.7**d, 0.2))
    assert int((depth == 1).sum()) == int((seeds - 1) * 0.7)


def _speculators_file(name: str):
    """speculators 0.9.0's own ``models/peagle/<name>.py`` from its venv (they import torch only)."""
    found = sorted(venv_dir().glob(f"lib/python*/site-packages/speculators/models/peagle/{name}.py"))
    if not found:
        cannot_run(f"no speculators 0.9.0 venv at {venv_dir()} (python -m eaglewire_testing.speculators_venv)")
    spec = importlib.util.spec_from_file_location(f"speculators_peagle_{name}", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.integration  # speculators' own code
@pytest.mark.parametrize("max_anchors", [None, 20])
def test_cod_draws_what_speculators_draws(max_anchors):
    """Same global seed, same shifted loss mask (row 0 not trainable, as a prompt makes it): the same elements."""
    ref = _speculators_file("data")
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        tr = torch.rand(80, generator=g) > 0.4
        tr[:3] = False
        torch.manual_seed(seed)
        want = ref.generate_cod_sample_indices(80, tr.float()[None], num_depths=5, max_anchors=max_anchors)
        torch.manual_seed(seed)
        got = cod_sample(tr, 5, max_anchors=max_anchors)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.integration  # speculators' own code
def test_rollout_mask_is_speculators():
    ref = _speculators_file("attention")
    anchor, depth = cod_sample(torch.rand(30, generator=torch.Generator().manual_seed(1)) > 0.2, 4,
                               generator=torch.Generator().manual_seed(2))
    mod = ref.create_peagle_mask_mod(anchor, depth, torch.zeros(30, dtype=torch.long))
    idx = torch.arange(anchor.numel())
    want = mod(0, 0, idx[:, None], idx[None, :])
    got = peagle_mask(anchor[None], depth[None], torch.ones(1, anchor.numel(), dtype=torch.bool))[0, 0]
    assert torch.equal(got, want)


def test_a_batch_with_nothing_to_train_is_refused():
    m, b = model(), batch()
    b["loss_mask"] = torch.zeros_like(b["loss_mask"])
    b["loss_mask"][:, 0] = 1  # only the first token: no draft row has a target
    with pytest.raises(EaglewireError, match="no loss-masked position after the first token"):
        peagle_forward(m, **b)
    assert A * HT == m.fc.in_features
