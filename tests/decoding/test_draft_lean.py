"""The drafter's one-call-per-layer step and its growing cache against the model's own step.

Reference: :meth:`Eagle3Drafter.step` with its K/V concatenated per call (the
path training runs), independent of :class:`DraftCache` and the C++ layer.
Every drafter variant decoding serves is run: the official layout, the
residual taken after the hidden norm, the normed feedback, a second layer,
and a grouped-query target.
"""

from __future__ import annotations

import pytest
import torch

from conftest import cat_kv, random_drafter
from eaglewire.decoding.draft import DraftRunner
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.drafter.model import causal_mask
from eaglewire.targets.smallm import smallm_kernel

VARIANTS = {
    "official": {},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_output": {"norm_output": True},
    "two_layers": {"num_layers": 2},
}


def _drafter(target, **overrides) -> Eagle3Drafter:
    if not overrides:
        return random_drafter(target)
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=target.vocab_size // 2, **overrides)
    torch.manual_seed(1)
    d = Eagle3Drafter(cfg)
    for p in d.parameters():  # random weights of a trained drafter's scale, norms away from 1
        torch.nn.init.normal_(p, 0.0, 0.2) if p.dim() > 1 else torch.nn.init.uniform_(p, 0.5, 1.5)
    d.load_target_embedding(target.model.get_input_embeddings().weight)
    return d.eval()


class _Reference:
    """The model's step on concatenated K/V: what the runner's cache and layers must reproduce."""

    def __init__(self, drafter):
        self.d, self.kv, self.n = drafter, None, 0

    def extend(self, ids, feats):
        t = ids.shape[1]
        out, new = self.d.step(ids, self.d.project(feats), torch.arange(self.n, self.n + t)[None], self.kv,
                               causal_mask(t, self.n))
        self.kv, self.n = cat_kv(self.kv, new), self.n + t
        return out

    def draft(self, ids, hidden, pos, past, allowed):  # one tree level over past = real + earlier drafts
        return self.d.step(ids, hidden, torch.full((1, ids.shape[1]), pos), past, allowed[None, None])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@torch.inference_mode()
def test_lean_draft_equals_the_model_step(tiny_targets, arch, variant):
    if smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")
    t = tiny_targets[arch]
    drafter = _drafter(t, **VARIANTS[variant])
    runner, ref = DraftRunner(drafter), _Reference(drafter)
    assert runner.lean is not None
    g = torch.Generator().manual_seed(0)
    width = drafter.config.num_aux * drafter.config.target_hidden_size
    # a prompt (model path, > MAX_ROWS), then accepted runs of 3 and 1 (the C++ layer), growing past 256 rows
    for t_new in (40, 3, 1, 5, 230, 2):
        ids = torch.randint(0, t.vocab_size, (1, t_new), generator=g)
        feats = torch.randn(1, t_new, width, generator=g)
        runner.extend(ids, feats)
        want = ref.extend(ids, feats)
        torch.testing.assert_close(runner.last, want[:, -1:], rtol=1e-4, atol=1e-4)
    for (k_got, v_got), (k_want, v_want) in zip(runner.real_kv(), ref.kv, strict=True):
        torch.testing.assert_close(k_got, k_want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v_got, v_want, rtol=1e-4, atol=1e-4)
    # two tree levels of 3 nodes: the second sees its own ancestors among the first level's entries only
    h = runner.last.expand(1, 3, -1)
    lvl1 = torch.eye(3, dtype=torch.bool)
    out1 = runner._step([5, 6, 7], h, runner.length, 0, lvl1.tolist())
    want1, new1 = ref.draft(torch.tensor([[5, 6, 7]]), h, ref.n, ref.kv, torch.cat([torch.ones(3, ref.n, dtype=torch.bool), lvl1], 1))
    torch.testing.assert_close(out1, want1, rtol=1e-4, atol=1e-4)
    lvl2 = torch.tensor([[0, 1, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [0, 0, 1, 0, 0, 1]], dtype=torch.bool)
    out2 = runner._step([8, 9, 10], out1, runner.length + 1, 3, lvl2.tolist())
    allowed2 = torch.cat([torch.ones(3, ref.n, dtype=torch.bool), lvl2], 1)
    want2, _ = ref.draft(torch.tensor([[8, 9, 10]]), want1, ref.n + 1, cat_kv(ref.kv, new1), allowed2)
    torch.testing.assert_close(out2, want2, rtol=1e-4, atol=1e-4)
    # the round's draft rows are overwritten by the next extend, the real ones kept
    ids, feats = torch.tensor([[11, 12]]), torch.randn(1, 2, width, generator=g)
    runner.extend(ids, feats)
    torch.testing.assert_close(runner.last, ref.extend(ids, feats)[:, -1:], rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_lean_and_model_paths_draft_the_same_trees(tiny_targets, trained_drafters):
    """Whole rounds: the runner with the C++ layer and without it (fast=False) draft identical trees and chains."""
    if smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")
    t = tiny_targets["llama"]
    drafter, _ = trained_drafters["llama"]
    fast, slow = DraftRunner(drafter), DraftRunner(drafter, fast=False)
    assert fast.lean is not None and slow.lean is None
    g = torch.Generator().manual_seed(3)
    width = drafter.config.num_aux * drafter.config.target_hidden_size
    for t_new in (30, 2, 1, 4):
        ids, feats = torch.randint(0, t.vocab_size, (1, t_new), generator=g), torch.randn(1, t_new, width, generator=g)
        fast.extend(ids, feats)
        slow.extend(ids, feats)
        for root in (3, 17):
            a, b = fast.tree(root, 3, 3, 10), slow.tree(root, 3, 3, 10)
            assert (a.tokens, a.parents) == (b.tokens, b.parents)
            a, b = fast.chain(root, 4), slow.chain(root, 4)
            assert a.tokens == b.tokens
