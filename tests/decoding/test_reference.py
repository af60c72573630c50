"""The reference loop (decoding/reference.py) as the engine's oracle: same tokens, same accepted drafts per round.

The reference itself is held to the target's own greedy continuation (transformers' generate), which neither
shares code with it nor with the engine.
"""

from __future__ import annotations

import pytest

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding import engine as engine_mod
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.reference import speculative_decode
from eaglewire.saved.depth import DEPTH

pytestmark = pytest.mark.unit

MAX_NEW = 20


def _both(t, drafter, points, prompt: str):
    eng = SpecEngine(t, drafter, points)
    ids = eng.encode(prompt)
    r = eng.generate(ids, SpecConfig(mode="chain", depth=DEPTH, max_new_tokens=MAX_NEW, min_prob=0.0))
    ref = speculative_decode(t, drafter, points, ids, MAX_NEW, DEPTH, set(t.eos_ids()))
    return ids, (r.token_ids, [s.accepted for s in r.metrics.steps]), ref


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_engine_decodes_as_the_reference_round_by_round(tiny_targets, trained_drafters, arch):
    t = tiny_targets[arch]
    drafter, points = trained_drafters[arch]
    accepted = 0
    for p in PROMPTS[:2]:
        ids, got, (tokens, rounds) = _both(t, drafter, points, p)
        assert tokens == greedy_reference(t, ids, MAX_NEW)  # the reference is lossless
        assert got == (tokens, rounds), p
        accepted += sum(rounds)
    assert accepted > 0  # rounds that accept drafts: an acceptance count off by one would show


def test_an_acceptance_off_by_one_is_caught(tiny_targets, trained_drafters, monkeypatch):
    """A walk that keeps one accepted draft fewer stays lossless (the target's bonus is that draft), so only the
    per-round counts tell: the comparison above must see it."""
    walk = engine_mod.walk_greedy

    def one_short(tree, rows):
        path, bonus = walk(tree, rows)
        return (path[:-1], tree.tokens[path[-1] - 1]) if path else (path, bonus)

    monkeypatch.setattr(engine_mod, "walk_greedy", one_short)
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    _, (tokens, rounds), (ref_tokens, ref_rounds) = _both(t, drafter, points, PROMPTS[0])
    assert tokens == ref_tokens and rounds != ref_rounds
