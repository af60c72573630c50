"""Two drafters on the same answers: the paired difference and its interval (decoding/acceptance.paired_interval)."""

import random

import pytest

from eaglewire.decoding.acceptance import paired_interval


def _answers(n, seed, extra=0.0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        rounds = rng.randint(20, 60)
        ease = rng.random()  # answers differ a lot in how much any drafter gets accepted
        out.append([int(rounds * ease * 1.5 + extra * rounds), rounds])
    return out


def test_identical_drafters_differ_by_nothing():
    a = _answers(40, 0)
    r = paired_interval(a, a)
    assert r["diff"] == 0 and r["ci95"] == [0.0, 0.0] and r["b_better_on"] == 0


def test_a_small_uniform_gain_is_positive_over_its_whole_interval():
    a = _answers(54, 1)
    b = [[acc + max(1, n // 25), n] for acc, n in a]  # ~0.04 more accepted per round on every answer
    r = paired_interval(a, b)
    want = (sum(x for x, _ in b) - sum(x for x, _ in a)) / sum(n for _, n in a)  # the naive difference
    assert r["diff"] == pytest.approx(want)
    assert 0 < r["ci95"][0] <= r["diff"] <= r["ci95"][1] and r["b_better_on"] == 54
    assert paired_interval(b, a)["ci95"][1] < 0  # and the other way round, negative


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="paired answers"):
        paired_interval(_answers(3, 0), _answers(4, 0))
