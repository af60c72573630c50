"""Speculative decoding: greedy exactness, KV rollback, stops, metrics."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCHS, PROMPTS, greedy_reference, random_drafter
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.decoding.tree import DraftTree
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import eagle3_default

MAX_NEW = 24


def _check_exact(target, drafter, points, modes=("chain", "tree"), prompts=PROMPTS[:2], **kw):
    kw.setdefault("min_prob", 0.0)  # the tiny drafters are unsure: the default threshold would gate every draft off
    eng = SpecEngine(target, drafter, points)
    results = {}
    for p in prompts:
        ids = eng.encode(p)
        ref = greedy_reference(target, ids, MAX_NEW)
        for mode in modes:
            r = eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=MAX_NEW, **kw))
            assert r.token_ids == ref, (mode, p)
            results.setdefault(mode, []).append(r)
    return results


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_exact_random_drafter(tiny_targets, arch):
    t = tiny_targets[arch]
    _check_exact(t, random_drafter(t), eagle3_default(t.num_layers), modes=("plain", "chain", "tree"))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_exact_trained_drafter(tiny_targets, trained_drafters, arch):
    t = tiny_targets[arch]
    drafter, points = trained_drafters[arch]
    res = _check_exact(t, drafter, points, prompts=PROMPTS[:3])
    # other tree shapes and the unpacked (plain MKL) path must agree too
    _check_exact(t, drafter, points, modes=("tree",), prompts=PROMPTS[3:4], top_k=2, tree_depth=3, total_tokens=6)
    if arch == "llama":
        for mode in ("chain", "tree"):
            steps = [s for r in res[mode] for s in r.metrics.steps]
            tau = sum(s.accepted + s.bonus for s in steps) / len(steps)
            assert tau > 1.5, (mode, tau)


def test_unpacked_path_exact(tiny_targets):
    t = tiny_targets["llama"]
    eng = SpecEngine(t, random_drafter(t), eagle3_default(t.num_layers), fast=False)
    ids = eng.encode(PROMPTS[0])
    assert eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=16, min_prob=0.0)).token_ids == greedy_reference(t, ids, 16)


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_tree_forward_and_rollback(tiny_targets, arch):
    """Each tree node's hidden equals decoding its path alone; keep() leaves exactly the path's KV."""
    t = tiny_targets[arch]
    prefix = torch.tensor([[5, 17, 33, 8, 91, 12]])
    tree = DraftTree(root=40, tokens=[7, 9, 11, 13, 15], parents=[0, 0, 1, 2, 3])
    runner = TargetRunner(t)
    runner.forward(prefix)
    p = runner.length
    hidden, _ = runner.forward(torch.tensor([tree.all_tokens]), tree.position_ids(p), tree.ancestor_mask())
    ref = TargetRunner(t)
    for node, path in [(4, [0, 2, 4]), (5, [0, 1, 3, 5])]:
        ref.reset()
        toks = [tree.all_tokens[i] for i in path]
        h_ref, _ = ref.forward(torch.cat([prefix, torch.tensor([toks])], 1))
        torch.testing.assert_close(hidden[0, node], h_ref[0, -1], rtol=1e-4, atol=1e-4)
    runner.keep(len(tree) + 1, [0, 2, 4])
    ref.reset()
    ref.forward(torch.cat([prefix, torch.tensor([[40, 9, 13]])], 1))
    assert runner.length == ref.length == p + 3
    for a, b in zip(runner.cache.layers, ref.cache.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-4)
    # the next forward after rollback sees exactly the kept prefix
    h1, _ = runner.forward(torch.tensor([[21]]))
    h2, _ = ref.forward(torch.tensor([[21]]))
    torch.testing.assert_close(h1, h2, rtol=1e-4, atol=1e-4)


def test_metrics_consistency(tiny_targets, trained_drafters):
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points)
    for mode in ("chain", "tree"):
        r = eng.generate(eng.encode(PROMPTS[1]), SpecConfig(mode=mode, max_new_tokens=30, min_prob=0.0))
        m, d = r.metrics, r.to_dict()
        assert m.prefill_tokens + sum(s.accepted + s.bonus for s in m.steps) - m.stop_trimmed == len(r.token_ids)
        assert d["generated_tokens"] == len(r.token_ids) == 30
        assert sum(d["accept_hist"].values()) == d["verify_steps"]
        assert abs(d["tau"] - (d["accepted_tokens"] + d["bonus_tokens"]) / d["verify_steps"]) < 1e-9
        cum, cond = d["accept_per_position"]["cumulative"], d["accept_per_position"]["conditional"]
        assert len(cum) == len(cond) > 0 and all(0 <= x <= 1 for x in cum + cond)
        assert all(a >= b - 1e-12 for a, b in zip(cum, cum[1:], strict=False))  # cumulative never rises
        tm = d["time_s"]
        assert abs(tm["prefill"] + tm["draft"] + tm["verify"] + tm["other"] - tm["total"]) < 1e-6
        assert d["tokens_per_s"] > 0


def test_stop_string_and_eos(tiny_targets, trained_drafters):
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points)
    ids = eng.encode(PROMPTS[2])
    full = eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=30, min_prob=0.0))
    text = full.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip()
    r = eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=30, stop=[stop], min_prob=0.0))
    assert r.finish_reason == "stop_string"
    assert r.text == text[: text.find(stop)]
    assert stop in t.tokenizer.decode(r.token_ids) and r.token_ids == full.token_ids[: len(r.token_ids)]
    m = r.metrics
    assert m.prefill_tokens + sum(s.accepted + s.bonus for s in m.steps) - m.stop_trimmed == len(r.token_ids)
    # EOS: a drafter-free target whose eos is forced to be the first greedy token stops at once
    eos_first = full.token_ids[0]
    orig = t.model.generation_config.eos_token_id
    t.model.generation_config.eos_token_id = [eos_first]
    try:
        r = eng.generate(ids, SpecConfig(mode="chain", max_new_tokens=30, min_prob=0.0))
    finally:
        t.model.generation_config.eos_token_id = orig
    assert r.token_ids == [eos_first] and r.finish_reason == "eos"


def test_bad_prompts(tiny_targets):
    t = tiny_targets["llama"]
    eng = SpecEngine(t)
    with pytest.raises(EaglewireError, match="empty"):
        eng.encode("   ")
    with pytest.raises(EaglewireError, match="context"):
        eng.generate([5] * 2000, SpecConfig(mode="plain"))
    with pytest.raises(EaglewireError, match="drafter"):
        eng.generate([5, 6], SpecConfig(mode="tree"))


@pytest.mark.parametrize("arch", ["mistral", "qwen3"])
def test_sliding_window_past_the_window(tiny_targets, trained_drafters, arch):
    """Chain and tree decoding stay equal to transformers long after the context passes the window.

    tiny:mistral windows every layer, tiny:qwen3 layers 4-7 (mixed layer types,
    the dict-of-masks path); both windows are 16 tokens.
    """
    t = tiny_targets[arch]
    window = t.model.config.sliding_window
    assert window == 16 and (arch == "mistral" or len(set(t.model.config.layer_types)) == 2)
    drafter, points = trained_drafters[arch]
    eng = SpecEngine(t, drafter, points)
    ids = eng.encode(PROMPTS[1])
    ref = greedy_reference(t, ids, 64)
    assert len(ids) + len(ref) > 3 * window
    for mode, kw in (("chain", {}), ("tree", {}), ("tree", {"top_k": 2, "tree_depth": 3, "total_tokens": 6})):
        r = eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=64, **{"min_prob": 0.0, **kw}))
        assert r.token_ids == ref, (mode, kw)
        assert sum(s.accepted for s in r.metrics.steps) > 0  # drafts were accepted and rolled back past the window


def _path_prob(dr, tokens: list[int]) -> float:
    """Naive reference: the drafter's cumulative probability of a path, drafted one token at a time."""
    from conftest import cat_kv

    h, past, prob = dr.last, dr.real_kv(), 1.0
    for step, tok in enumerate(tokens):
        p = dr._logits(h)[0, -1].softmax(-1)  # [Dv]
        prob *= float(p[int((dr.draft_ids == tok).nonzero())])
        mask = torch.ones(1, 1, 1, dr.length + step + 1, dtype=torch.bool)
        h, new = dr.drafter.step(torch.tensor([[tok]]), h, torch.tensor([[dr.length + step]]), past, mask)
        past = cat_kv(past, new)
    return prob


def _paths(tree: DraftTree) -> list[tuple[int, ...]]:
    out = []
    for i in range(1, len(tree) + 1):
        path, cur = [], i
        while cur:
            path.append(tree.tokens[cur - 1])
            cur = tree.parents[cur - 1]
        out.append(tuple(reversed(path)))
    return out


def test_min_prob_tree_keeps_exactly_the_likely_nodes(tiny_targets, trained_drafters):
    """--min-prob: the tree is the unthresholded tree minus the nodes the drafter gives < min_prob."""
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points)
    eng.generate(eng.encode(PROMPTS[2]), SpecConfig(mode="tree", max_new_tokens=9, min_prob=0.0))
    dr, root = eng.draft, 17
    with torch.inference_mode():
        full = dr.tree(root, 3, 3, 13)
        probs = {p: _path_prob(dr, list(p)) for p in _paths(full)}
        ranked = sorted(set(probs.values()))
        gaps = [(b - a, (a + b) / 2) for a, b in zip(ranked, ranked[1:], strict=False)]
        for _, thr in sorted(gaps)[-2:]:  # two thresholds far from every node's probability
            cut = dr.tree(root, 3, 3, 13, min_prob=thr)
            assert set(_paths(cut)) == {p for p, q in probs.items() if q >= thr}, thr
            assert all(par < i for i, par in enumerate(cut.parents, start=1))  # parents first
        assert len(dr.tree(root, 3, 3, 13, min_prob=min(1.5 * max(ranked), 0.999))) == 0


def test_min_prob_greedy_exact_and_gated(tiny_targets, trained_drafters):
    """Gated rounds verify the last token alone; the output stays the target's greedy output."""
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    drafted = {}
    for mp in (0.0, 0.002, 0.01, 0.03):
        res = _check_exact(t, drafter, points, prompts=PROMPTS[:2], min_prob=mp)
        for mode, rs in res.items():
            d = [r.to_dict() for r in rs]
            drafted[mode, mp] = sum(x["drafted_tokens"] for x in d) / sum(x["verify_steps"] for x in d)
            gated = sum(x["rounds_without_drafts"] for x in d)
            # the tiny drafter is unsure (first drafts ~1-3%): 0.03 gates every round off
            assert (gated > 0) == (mp == 0.03), (mode, mp, gated)
    for mode in ("chain", "tree"):
        d = [drafted[mode, mp] for mp in (0.0, 0.002, 0.01, 0.03)]
        assert d == sorted(d, reverse=True) and d[0] > d[2] > d[3] == 0, (mode, d)
    with pytest.raises(EaglewireError, match="min-prob"):
        SpecConfig(min_prob=1.0).check()


def test_min_prob_default_follows_the_device(tiny_targets, trained_drafters):
    """No --min-prob: 0.1 on CPU (a wide verify costs more than a decode step), 0 on CUDA."""
    from eaglewire.decoding.config import BenchConfig
    from eaglewire.decoding.engine import default_min_prob
    from eaglewire.infra.options import config_from_dict

    assert default_min_prob("cpu") == 0.1 and default_min_prob("cuda:0") == 0.0
    t = tiny_targets["llama"]
    drafter, points = trained_drafters["llama"]
    eng = SpecEngine(t, drafter, points)
    ids = eng.encode(PROMPTS[0])
    auto = eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=12))
    explicit = eng.generate(ids, SpecConfig(mode="tree", max_new_tokens=12, min_prob=0.1))
    assert [s.drafted for s in auto.metrics.steps] == [s.drafted for s in explicit.metrics.steps]
    with pytest.raises(EaglewireError, match="--min-prob"):
        config_from_dict(BenchConfig, {"drafter": "x", "min_prob": 1.5})
    assert config_from_dict(BenchConfig, {"drafter": "x"}).min_prob is None


def _naive_step_confidence(logits: torch.Tensor, k: int = 10) -> float:
    """llama.cpp's draft sampler written out: top-k 10 by logit, then p = exp(l - max) / sum over those k."""
    import math

    top = sorted((float(x) for x in logits), reverse=True)[:k]
    ws = [math.exp(x - top[0]) for x in top]
    return ws[0] / sum(ws)


def test_step_gate_stops_the_chain_where_llamacpp_would(tiny_targets, trained_drafters, monkeypatch):
    """--gate step: the chain is the ungated chain cut before the first step whose best draft, renormalized over
    its 10 best logits, is below min_prob; the cumulative (path) gate cuts elsewhere; outputs stay exact."""
    from eaglewire.decoding.draft import DraftRunner, step_confidence

    # Qwen3's: the brief training leaves tiny:llama's (head_dim 32) confidences rising along every chain, where
    # both gates cut at the first step
    t = tiny_targets["qwen3"]
    drafter, points = trained_drafters["qwen3"]
    eng = SpecEngine(t, drafter, points)
    seen, real = [], DraftRunner._logits
    monkeypatch.setattr(DraftRunner, "_logits", lambda self, h: seen.append(real(self, h)) or seen[-1])
    confs, cut_differs = [], False
    for prompt in PROMPTS[:4]:  # the drafter's state after each prompt's answer: a chain drafts from there
        eng.generate(eng.encode(prompt), SpecConfig(mode="chain", max_new_tokens=9, min_prob=0.0))
        dr, root = eng.draft, 17
        with torch.inference_mode():
            seen.clear()
            full = dr.chain(root, 5)
            conf = [_naive_step_confidence(lg[0, -1]) for lg in seen]  # [5]
            assert [step_confidence(lg[0, -1]) for lg in seen] == pytest.approx(conf, rel=1e-5)
            confs += conf
            for thr in sorted(set(conf)):
                thr = thr * (1 + 1e-4)  # just above one step's confidence: that step is where the chain stops
                keep = next((i for i, c in enumerate(conf) if c < thr), 5)
                assert dr.chain(root, 5, min_prob=thr, gate="step").tokens == full.tokens[:keep], (prompt, thr)
                cut_differs |= len(dr.chain(root, 5, min_prob=thr, gate="path")) != keep
    assert len(set(confs)) >= 10 and cut_differs, confs  # many distinct cuts, and the two rules differ
    mp = sorted(confs)[len(confs) // 2]
    res = _check_exact(t, drafter, points, modes=("chain",), prompts=PROMPTS[:2], min_prob=mp, gate="step")
    assert sum(r.to_dict()["rounds_without_drafts"] for r in res["chain"]) > 0  # the gate acted
    with pytest.raises(EaglewireError, match="--gate"):
        SpecConfig(gate="top").check()
