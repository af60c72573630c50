"""The offline mean acceptance length counts rounds exactly as the engine's chain decoding takes them."""

from __future__ import annotations

import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.doctor.drafter import (
    bootstrap_interval,
    chain_stats,
    decode_rounds,
    unroll_predictions,
)
from eaglewire.drafter.checkpoint import load_checkpoint
from eaglewire.target.points import parse_points


def _naive_rounds(run: list[int], start: list[bool]) -> list[int]:
    """Reference: walk token by token; a position is either inside an accepted run or begins a round."""
    out, busy = [], 0
    for t, ok in enumerate(start):
        if busy:
            busy -= 1
            continue
        if ok:
            out.append(run[t])
            busy = run[t]
    return out


def test_decode_rounds_matches_the_stepwise_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        T = int(torch.randint(1, 30, (1,), generator=g))
        run = torch.randint(0, 4, (T,), generator=g)
        start = torch.rand(T, generator=g) > 0.2
        assert decode_rounds(run, start) == _naive_rounds(run.tolist(), start.tolist())


def test_offline_rounds_equal_the_engine_rounds(tiny_drafter, tiny_targets):
    """Engine-generated greedy answers, captured in process, scored offline: every round as the engine counted it."""
    from eaglewire.data.extract import forward_features

    ckpt, data = tiny_drafter
    target = tiny_targets["llama"]
    model, prov = load_checkpoint(ckpt)
    pts = parse_points(prov.point_names, target.num_layers)
    head = target.model.get_output_embeddings().weight.detach().float()
    ds = FeatureDataset(data, verify=False)
    eng = SpecEngine(target, model, pts)
    depth, n_new, seen = 3, 20, []
    for i in range(8):
        item = ds[i]
        a = int(item["loss_mask"].float().argmax())
        prompt = item["input_ids"][:a].tolist()
        res = eng.generate(prompt, SpecConfig(mode="chain", depth=depth, min_prob=0.0, max_new_tokens=n_new))
        seq = prompt + res.token_ids
        feats, fin = forward_features(target, [(0, seq, None)], pts)[0]
        mask = torch.zeros(len(seq), dtype=torch.bool)
        mask[a:] = True
        b = collate([{"input_ids": torch.tensor(seq), "loss_mask": mask, "features": feats, "target_hidden": fin}])
        pred, tgt, m = unroll_predictions(model, b, head, depth)
        hit = ((pred + model.d2t[pred]) == tgt) & m
        offline = decode_rounds(torch.cumprod(hit.long(), -1).sum(-1)[0], m[0, :, 0])
        served = [s.accepted for s in res.metrics.steps]
        # the engine's last round may be cut by max_new_tokens; the data's by the end of the answer
        assert served[:-1] == offline[: len(served) - 1], (i, served, offline)
        seen += served[:-1]
    assert len(set(seen)) >= 2, seen  # both accepted and rejected rounds were compared


def test_interval_is_wide_for_few_samples_and_narrows(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    model, _ = load_checkpoint(ckpt)
    head = tiny_targets["llama"].model.get_output_embeddings().weight.detach().float()
    ds = FeatureDataset(data, verify=False)
    one = chain_stats(model, ds, head, 1, 3)
    assert one["mean_acceptance_length_ci95"] is None
    few, many = chain_stats(model, ds, head, 4, 3), chain_stats(model, ds, head, len(ds), 3)
    for s in (few, many):
        lo, hi = s["mean_acceptance_length_ci95"]
        assert lo <= s["mean_acceptance_length"] <= hi
    assert bootstrap_interval([[1, 1], [1, 1], [1]]) == [2.0, 2.0]  # no spread, no width
