"""P-EAGLE parallel decoding with sampling: the emitted tokens follow the target's own (warped) distribution.

The rejection rule is the engine's one, shared with DFlash (`verify_block`; its synthetic test with planted
bugs is tests/decoding/test_dflash_sampling.py). What is P-EAGLE's own: the K drafts come from one forward
(the last real row, then the mask slots), draft k drawn from its own row's p_k and handed to the verify with
exactly that p_k over the target vocabulary. The end-to-end test compares the engine's marginals with the
exact ones (prefixes enumerated on the target) by chi-square; the spy test pins what the verify is handed,
with planted bugs (another row's p, the greedy draft) that it must catch.
"""

from __future__ import annotations

import pytest
import torch
from test_dflash_sampling import exact_marginals, sampled_marginals
from test_sampling import chi2_pvalue

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding import peagle as peagle_decoding
from eaglewire.decoding.engine import SpecConfig
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.decoding.verify import warp
from eaglewire.targets.chat import encode, render
from eaglewire_testing.peagle_serving import train_peagle

pytestmark = pytest.mark.unit
TEMP, TOP_P, N = 0.3, 0.3, 150


def _encode(target, text: str) -> list[int]:
    return encode(target.tokenizer, render(target.tokenizer, [{"role": "user", "content": text}], True))


@pytest.fixture(scope="module")
def mistral_peagle(tiny_targets):
    """(target, points, a P-EAGLE drafter briefly trained on tiny:mistral's own greedy text): drafts get accepted
    (a random drafter's samples almost never land in the target's nucleus, leaving the verify untested)."""
    target = tiny_targets["mistral"]
    prompts = [_encode(target, p) for p in PROMPTS[:4]]
    answers = [greedy_reference(target, p, 24) for p in prompts]
    drafter, points = train_peagle(target, prompts, answers, steps=40)
    return target, points, drafter, prompts[2] + answers[2][:4]


def test_engine_parallel_sampling_lossless(mistral_peagle):
    """Marginals of the 2nd and 3rd tokens, decided by verifying drafts 1 and 2 of one parallel forward (the last
    real row and the first mask slot), match the target's. The context is inside a trained answer: there the
    slots' samples land in the target's nucleus (elsewhere this briefly trained drafter accepts nothing)."""
    target, points, drafter, ids = mistral_peagle
    counts = sampled_marginals(ParallelEngine(target, drafter, points), ids, TEMP, TOP_P, N, 3)
    exact = exact_marginals(target, ids, 3, TEMP, TOP_P)
    for i in (1, 2):
        assert chi2_pvalue(counts[i], exact[i], N) > 1e-3, i


def _rolled(real):
    def bug(self, *a, **k):  # planted: draft k handed to the verify with draft k+1's p
        drafts, probs = real(self, *a, **k)
        return drafts, probs[1:] + probs[:1]
    return bug


def _greedy(real):
    def bug(self, tokens, feats, k, *rest):  # planted: the argmax drafted, handed with the sampled p
        _, probs = real(self, tokens, feats, k, *rest)
        return [int(p.argmax()) for p in probs], probs
    return bug


@pytest.mark.parametrize("bug", [None, _rolled, _greedy])
def test_sampled_drafts_come_from_each_rows_own_distribution(mistral_peagle, monkeypatch, bug):
    """What the verify is handed: p_k = warp(row k's logits) over the target vocabulary and d_k one draw from it."""
    target, points, drafter, _ = mistral_peagle
    seen, logits_seen = [], []
    real_verify, real_logits = peagle_decoding.verify_block, peagle_decoding.ParallelDrafter.logits

    def spy(root, drafts, probs, rows, temperature, top_p, gen):
        if drafts:
            seen.append((drafts, probs))
        return real_verify(root, drafts, probs, rows, temperature, top_p, gen)

    def logits_spy(self, tokens, feats, k):
        z = real_logits(self, tokens, feats, k)
        logits_seen.append(z)
        return z

    monkeypatch.setattr(peagle_decoding, "verify_block", spy)
    monkeypatch.setattr(peagle_decoding.ParallelDrafter, "logits", logits_spy)
    if bug:
        monkeypatch.setattr(peagle_decoding.ParallelDrafter, "draft_sampled",
                            bug(peagle_decoding.ParallelDrafter.draft_sampled))
    eng = ParallelEngine(target, drafter, points)
    for seed in range(5):
        eng.generate(_encode(target, PROMPTS[1]), SpecConfig(mode="chain", depth=3, temperature=1.0, top_p=0.9,
                                                            max_new_tokens=8, seed=seed))
    ids = drafter.draft_target_ids()

    def check():
        differ = 0
        assert len(seen) == len(logits_seen) >= 5
        for (drafts, probs), z in zip(seen, logits_seen, strict=True):
            assert len(probs) == len(drafts) == z.shape[0]
            for k, (d, p) in enumerate(zip(drafts, probs, strict=True)):
                torch.testing.assert_close(p[ids], warp(z[k], 1.0, 0.9))
                assert p.shape[0] == target.vocab_size and p[d] > 0
                differ += d != int(ids[z[k].argmax()])
        assert differ > 0  # sampled, not greedy

    if bug is None:
        check()
    else:
        with pytest.raises(AssertionError):
            check()
