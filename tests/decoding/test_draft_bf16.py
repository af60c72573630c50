"""Drafting with the drafter's matrices in bf16 (`--draft-weights bf16`): the drafts of the bf16-rounded
drafter, and outputs still exactly the target's.

Reference: the model's own fp32 step (concatenated K/V, the training path) on
a copy of the drafter whose weight matrices were rounded to bf16 and widened
back, so the only difference left is the order of float sums.
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


def _rounded(drafter):
    """The drafter with every matrix of its layers, its head and its fc rounded to bf16 (norms, embedding kept)."""
    r = copy.deepcopy(drafter)
    for layer in r.decoder_layers:
        for p in layer.parameters():
            if p.dim() == 2:
                p.data = p.data.bfloat16().float()
    r.lm_head.weight.data = r.lm_head.weight.data.bfloat16().float()
    r.fc.weight.data = r.fc.weight.data.bfloat16().float()
    return r


@pytest.fixture
def kernel():
    if smallm_kernel() is None:
        pytest.skip("the CPU kernel could not be built here")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@torch.inference_mode()
def test_bf16_drafting_equals_the_rounded_drafter(kernel, tiny_targets, arch):
    t = tiny_targets[arch]
    drafter = random_drafter(t)
    ref = _rounded(drafter)
    runner = DraftRunner(drafter, weights="bf16")
    assert runner.weights == "bf16" and runner.lean is not None
    g = torch.Generator().manual_seed(0)
    width = drafter.config.num_aux * drafter.config.target_hidden_size
    kv, n = None, 0
    for t_new in (3, 1, 16, 5, 2):  # every extend through the C++ layer (a prompt's > 16 rows runs fp32)
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


@torch.inference_mode()
def test_bf16_drafting_keeps_greedy_outputs_exact(kernel, tiny_targets, trained_drafters):
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points, draft_weights="bf16")
    assert eng.draft.weights == "bf16"
    for p in PROMPTS[:2]:
        ids = eng.encode(p)
        ref = greedy_reference(t, ids, 24)
        for mode in ("chain", "tree"):
            assert eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=24, min_prob=0.0)).token_ids == ref, mode


def test_without_the_kernel_the_drafter_runs_as_loaded(tiny_targets):
    t = tiny_targets["llama"]
    runner = DraftRunner(random_drafter(t), fast=False, weights="bf16")
    assert runner.lean is None and runner.weights == "fp32"
