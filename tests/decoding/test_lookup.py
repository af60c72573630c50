"""Context-lookup branch: proposals against a naive reference, merging, and greedy exactness with it."""

from __future__ import annotations

import random

import pytest

from conftest import ARCHS, PROMPTS, greedy_reference, random_drafter
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.lookup import merge_branch, propose
from eaglewire.decoding.tree import DraftTree
from eaglewire.targets.points import eagle3_default


def _naive_propose(ctx, k, nmax=4, nmin=2):
    for n in range(nmax, nmin - 1, -1):
        if len(ctx) <= n:
            continue
        hits = [j for j in range(len(ctx) - n) if ctx[j:j + n] == ctx[-n:]]
        if hits:
            return ctx[hits[-1] + n:hits[-1] + n + k]
    return []


def test_propose_matches_a_naive_search():
    rng = random.Random(0)
    for _ in range(300):
        ctx = [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
        assert propose(ctx, 6) == _naive_propose(ctx, 6), ctx
    assert propose([7, 8, 9, 1, 2, 7, 8], 3) == [9, 1, 2]
    assert propose([1, 2, 3], 3) == []


def test_merge_reuses_shared_prefixes_and_keeps_parents_first():
    t = DraftTree(root=0, tokens=[5, 6, 7], parents=[0, 1, 0], probs=[None, None, None])
    assert merge_branch(t, [5, 6, 9, 4]) == 2  # 5 and 6 exist: 9 under node 2, 4 under it
    assert t.tokens == [5, 6, 7, 9, 4] and t.parents == [0, 1, 0, 2, 4]
    assert all(p < i for i, p in enumerate(t.parents, start=1))
    assert merge_branch(t, [7]) == 0 and merge_branch(t, []) == 0


@pytest.mark.parametrize("arch", ARCHS[:2])
def test_greedy_output_is_exact_with_the_lookup_branch(tiny_targets, arch):
    t = tiny_targets[arch]
    eng = SpecEngine(t, random_drafter(t), eagle3_default(t.num_layers))
    # a prompt that repeats itself, so the branch is actually proposed and sometimes accepted
    prompts = [PROMPTS[0], "one two three one two three one two three one two"]
    for p in prompts:
        ids = eng.encode(p)
        ref = greedy_reference(t, ids, 24)
        r = eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=24, lookup=6, min_prob=0.0))
        assert r.token_ids == ref
        assert max(s.drafted for s in r.metrics.steps) > 0
