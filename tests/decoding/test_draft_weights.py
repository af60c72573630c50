"""Drafting with the drafter's matrices in bf16 or int8 rows (`--draft-weights bf16|int8`): the drafts of
the rounded drafter, and outputs still exactly the target's.

Reference: the model's own fp32 step (concatenated K/V, the training path) on
a copy of the drafter whose weight matrices were rounded to bf16, or to
int8 per row by an independent rounding written here, and widened back, so
the only difference left is the order of float sums.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import PROMPTS, cat_kv, greedy_reference, random_drafter
from eaglewire.decoding.draft import DraftRunner
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.drafter.model import causal_mask
from eaglewire.targets.smallm import smallm_kernel


def _round_int8(w: torch.Tensor) -> torch.Tensor:
    """Each row to the nearest of 255 levels spaced by its largest magnitude / 127 (written without the kernel's
    helpers: per row, in float64)."""
    out = torch.empty_like(w)
    for i, row in enumerate(w.double()):
        step = row.abs().max() / 127
        out[i] = (torch.round(row / step) * step).float() if step > 0 else row.float()
    return out


ROUND = {"bf16": lambda w: w.bfloat16().float(), "int8": _round_int8}


def _rounded(drafter, weights):
    """The drafter with every matrix of its layers, its head and its fc rounded (norms, embedding kept)."""
    r = copy.deepcopy(drafter)
    for layer in r.decoder_layers:
        for p in layer.parameters():
            if p.dim() == 2:
                p.data = ROUND[weights](p.data)
    r.lm_head.weight.data = ROUND[weights](r.lm_head.weight.data)
    r.fc.weight.data = ROUND[weights](r.fc.weight.data)
    return r


@pytest.fixture
def kernel():
    if smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")


@pytest.mark.parametrize("weights", list(ROUND))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@torch.inference_mode()
def test_narrow_drafting_equals_the_rounded_drafter(kernel, tiny_targets, arch, weights):
    t = tiny_targets[arch]
    drafter = random_drafter(t)
    ref = _rounded(drafter, weights)
    runner = DraftRunner(drafter, weights=weights)
    assert runner.weights == weights and runner.lean is not None
    g = torch.Generator().manual_seed(0)
    width = drafter.config.num_aux * drafter.config.target_hidden_size
    kv, n = None, 0
    for t_new in (40, 3, 1, 16, 5, 2):  # every extend through the C++ layer (a prompt's 40 rows in 16-row chunks)
        ids = torch.randint(0, t.vocab_size, (1, t_new), generator=g)
        feats = torch.randn(1, t_new, width, generator=g)
        runner.extend(ids, feats)
        want, new = ref.step(ids, ref.project(feats), torch.arange(n, n + t_new)[None], kv, causal_mask(t_new, n))
        kv, n = cat_kv(kv, new), n + t_new
        torch.testing.assert_close(runner.last, want[:, -1:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(runner._logits(runner.last), ref.logits(want[:, -1:]), rtol=1e-4, atol=1e-4)
    # and it is not the fp32 drafter: rounding the matrices moved the logits
    h = runner.last
    assert not torch.allclose(DraftRunner(drafter)._logits(h), runner._logits(h), rtol=0, atol=1e-6)


@pytest.mark.parametrize("weights", list(ROUND))
@torch.inference_mode()
def test_narrow_drafting_keeps_greedy_outputs_exact(kernel, tiny_targets, trained_drafters, weights):
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points, draft_weights=weights)
    assert eng.draft.weights == weights
    for p in PROMPTS[:2]:
        ids = eng.encode(p)
        ref = greedy_reference(t, ids, 24)
        for mode in ("chain", "tree"):
            assert eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=24, min_prob=0.0)).token_ids == ref, mode


def test_without_the_kernel_the_drafter_runs_as_loaded(tiny_targets):
    t = tiny_targets["llama"]
    for weights in ROUND:
        runner = DraftRunner(random_drafter(t), fast=False, weights=weights)
        assert runner.lean is None and runner.weights == "fp32"


def test_unknown_draft_weights_are_refused(kernel, tiny_targets):
    with pytest.raises(ValueError, match="expected one of fp32, bf16, int8"):
        DraftRunner(random_drafter(tiny_targets["llama"]), weights="int4")
