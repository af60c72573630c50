"""Sampling is lossless: emitted tokens follow the target's (warped) distribution.

Chi-square goodness of fit against exact distributions, seeded; bins with a
small expected count are pooled. A wrong rule (e.g. always accepting the
draft, or not removing rejected mass) fails these by many orders of magnitude.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import PROMPTS
from eaglewire.decoding import verify as verify_mod
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.tree import DraftTree
from eaglewire.decoding.verify import walk_sample, warp

V = 5


def chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for k, p in probs.items():
        if n * p >= 5:
            obs.append(counts.get(k, 0))
            exp.append(n * p)
        else:
            pool_o += counts.get(k, 0)
            pool_e += n * p
    assert sum(counts.get(k, 0) for k in counts if k not in probs) == 0, "impossible outcome sampled"
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def _q_logits(prefix: tuple) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(prefix) % (2**31))
    return torch.randn(V, generator=g, dtype=torch.float64).float() * 1.5


def test_walk_sample_lossless_synthetic():
    """Mixed tree: deterministic siblings, a child sampled from p (drawn anew each trial), a second level."""
    p_c = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1])
    temp, top_p = 1.0, 0.9
    gen = torch.Generator().manual_seed(0)
    n, counts = 20000, {}
    for _ in range(n):
        x = int(torch.multinomial(p_c, 1, generator=gen))  # a sampled draft is a draw from p
        tree = DraftTree(root=4, tokens=[0, 1, x, 0, 3], parents=[0, 0, 1, 2, 2], probs=[None, None, p_c, None, None])
        paths = {0: (), 1: (0,), 2: (1,), 3: (0, x), 4: (1, 0), 5: (1, 3)}
        path, bonus = walk_sample(tree, lambda i, paths=paths: _q_logits(paths[i]), temp, top_p, gen)
        out = [tree.tokens[i - 1] for i in path] + [bonus]
        if len(out) < 2:  # the next round would sample from the target at the new prefix
            out.append(int(torch.multinomial(warp(_q_logits(tuple(out)), temp, top_p), 1, generator=gen)))
        key = tuple(out[:2])
        counts[key] = counts.get(key, 0) + 1
    exact = {}
    q0 = warp(_q_logits(()), temp, top_p)
    for a, b in itertools.product(range(V), range(V)):
        p = float(q0[a]) * float(warp(_q_logits((a,)), temp, top_p)[b])
        if p > 0:
            exact[(a, b)] = p
    assert chi2_pvalue(counts, exact, n) > 1e-3


def _unnormalised_residual(q, x, p):
    r = q.clone()
    if p is None:
        r[x] = 0.0
    else:
        r = (q - p).clamp_min(0.0)
    return r if r.sum() > 0 else q


def _one_hot_removal(q, x, p):
    r = q.clone()
    r[x] = 0.0
    return r / r.sum()


@pytest.mark.parametrize("rule", ["ours", "unnormalised residual", "rejected draft removed as one-hot"])
def test_sibling_rejection_rule_and_negative_controls(monkeypatch, rule):
    """Two sampled siblings at one node: the first emitted token must follow q exactly.

    q and the two draft distributions are chosen so that the residual after
    the first rejection matters for the second sibling (q - p1 keeps 30% of
    the mass, and p2 is flat): each wrong rule shifts P(token 0) by >= 0.03,
    six standard errors at 8,000 trials (chi-square p ~ 1e-9 and below), and
    the test must reject it.
    """
    if rule == "unnormalised residual":
        monkeypatch.setattr(verify_mod, "_reject", _unnormalised_residual)
    elif rule != "ours":
        monkeypatch.setattr(verify_mod, "_reject", _one_hot_removal)
    q = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
    p1, p2 = torch.tensor([0.45, 0.05, 0.3, 0.1, 0.1]), torch.full((5,), 0.2)
    gen = torch.Generator().manual_seed(0)
    n, counts = 8000, {}
    for _ in range(n):
        x1, x2 = (int(torch.multinomial(p, 1, generator=gen)) for p in (p1, p2))
        tree = DraftTree(root=0, tokens=[x1, x2], parents=[0, 0], probs=[p1, p2])
        path, bonus = walk_sample(tree, lambda i: q.log(), 1.0, 1.0, gen)
        tok = tree.tokens[path[0] - 1] if path else bonus
        counts[tok] = counts.get(tok, 0) + 1
    pval = chi2_pvalue(counts, {k: float(q[k]) for k in range(5)}, n)
    if rule == "ours":
        assert pval > 1e-3
    else:
        assert pval < 1e-6, f"the test failed to reject a wrong rule ({rule}): p = {pval}"


def _exact_marginals(target, prompt: list[int], depth: int, temp: float, top_p: float) -> list[dict]:
    """Exact marginal distribution of each of the first ``depth`` sampled tokens (prefixes enumerated)."""
    eos = set(target.eos_ids())
    joint, marg = {(): 1.0}, []
    for _ in range(depth):
        nxt, m = {}, {}
        for pre, p in joint.items():
            if pre and pre[-1] in eos:  # generation stopped: no further token
                m[None] = m.get(None, 0.0) + p
                continue
            with torch.no_grad():
                logits = target.model(torch.tensor([prompt + list(pre)])).logits[0, -1]
            q = warp(logits, temp, top_p)
            for tok in torch.nonzero(q).flatten().tolist():
                nxt[(*pre, tok)] = p * float(q[tok])
                m[tok] = m.get(tok, 0.0) + p * float(q[tok])
        joint = nxt
        marg.append(m)
    return marg


def test_engine_sampling_lossless(tiny_targets, trained_drafters):
    """Marginals of the 2nd and 3rd tokens (decided by verification) match the target's.

    Also with --min-prob cutting the sampled chain short (the cut depends on the
    draft's own samples only, so it must stay lossless).
    """
    from conftest import greedy_reference

    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points)
    ids = eng.encode(PROMPTS[4])
    ids = ids + greedy_reference(t, ids, 16)  # a context where the random target is peaked
    temp, top_p, n = 0.3, 0.6, 200
    exact = _exact_marginals(t, ids, 3, temp, top_p)
    for mode, min_prob in (("chain", 0.0), ("tree", 0.0), ("chain", 0.05)):
        counts, accepted, drafted, rounds = [{}, {}, {}], 0, 0, 0
        for seed in range(n):
            r = eng.generate(ids, SpecConfig(mode=mode, temperature=temp, top_p=top_p, max_new_tokens=3, seed=seed,
                                             min_prob=min_prob))
            out = r.token_ids + [None] * (3 - len(r.token_ids))
            for i in range(3):
                counts[i][out[i]] = counts[i].get(out[i], 0) + 1
            accepted += sum(s.accepted for s in r.metrics.steps)
            drafted += sum(s.drafted for s in r.metrics.steps)
            rounds += len(r.metrics.steps)
        if min_prob:  # the cut is exercised: chains end early, some rounds still draft
            assert 0 < drafted / rounds < SpecConfig().depth, drafted / rounds
        assert accepted > 0, mode  # the draft path is exercised, not only bonus tokens
        for i in (1, 2):
            assert chi2_pvalue(counts[i], exact[i], n) > 1e-3, (mode, i)
