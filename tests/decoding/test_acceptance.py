"""The offline mean acceptance length counts rounds exactly as the engine's chain decoding takes them."""

from __future__ import annotations

import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.decoding.acceptance import (
    bootstrap_interval,
    chain_stats,
    decode_rounds,
    round_masks,
    unroll_predictions,
)
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.targets.points import parse_points


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


class _OneSample:
    """A dataset of one collated sample, so the test scores it through `chain_stats` itself."""

    def __init__(self, batch):
        self.item = {k: v[0] for k, v in batch.items()}

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return self.item


def test_decode_rounds_matches_the_stepwise_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        T = int(torch.randint(1, 30, (1,), generator=g))
        run = torch.randint(0, 4, (T,), generator=g)
        start = torch.rand(T, generator=g) > 0.2
        assert decode_rounds(run, start) == _naive_rounds(run.tolist(), start.tolist())


def test_rounds_end_with_the_answer():
    """Decoding emits an n-token answer as the prefill's token plus rounds: n - 1 rounds when every draft
    is rejected, ceil((n - 1) / (depth + 1)) when every draft is accepted; no draft past the end counts."""
    depth = 3
    for prompt, n, pad in [(5, 1, 0), (5, 2, 3), (4, 9, 0), (6, 13, 2), (3, 8, 5)]:
        T = prompt + n + pad
        b = {"loss_mask": torch.zeros(1, T, dtype=torch.bool), "attention_mask": torch.zeros(1, T, dtype=torch.bool)}
        b["loss_mask"][0, prompt:prompt + n] = True
        b["attention_mask"][0, :prompt + n] = True
        drafted, walk = round_masks(b, depth)
        assert decode_rounds(torch.zeros(T, dtype=torch.long), walk[0]) == [0] * (n - 1)
        run = torch.cumprod(drafted.long(), -1).sum(-1)[0]  # every draft inside the answer matches
        rounds = decode_rounds(run, walk[0])
        expect, left = [], n - 1  # tokens after the prefill's; a round accepts what is left, at most depth
        while left > 0:
            expect.append(min(depth, left))
            left -= depth + 1
        assert rounds == expect, (prompt, n, rounds)


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
        drafted, walk = round_masks(b, depth)
        hit = ((pred + model.d2t[pred]) == tgt) & m & drafted
        offline = decode_rounds(torch.cumprod(hit.long(), -1).sum(-1)[0], walk[0])
        served = [s.accepted for s in res.metrics.steps]
        # one round per engine round, none after the answer's last token; the engine's last round may
        # accept drafts past max_new_tokens (cut from its output), the data's answer ends there
        left = len(res.token_ids) - 1 - sum(r + 1 for r in served[:-1])
        assert offline == served[:-1] + [min(served[-1], left)], (i, served, offline)
        stats = chain_stats(model, _OneSample(b), head, 1, depth)
        assert stats["rounds"] == len(offline)
        assert abs(stats["mean_acceptance_length"] - (1 + sum(offline) / len(offline))) < 1e-9
        seen += served
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
