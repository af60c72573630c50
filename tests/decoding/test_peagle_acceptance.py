"""The offline P-EAGLE walk (held-out acceptance without the target) equals online parallel decoding, round for round.

The reference is independent: `ParallelEngine` runs the target and verifies each round's K drafts; the walk only
reads stored answers, the features and final-norm states a capture stored for them, and the target's head.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding.engine import SpecConfig
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.decoding.peagle_acceptance import parallel_chain_stats
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.chat import encode, render
from eaglewire.targets.points import FINAL_NORM, Point
from eaglewire_testing.peagle_serving import train_peagle

pytestmark = pytest.mark.unit
K, NEW = 3, 24


@pytest.fixture(scope="module")
def walked(tiny_targets):
    """tiny:mistral, a P-EAGLE drafter trained briefly on its own greedy answers, and those answers stored as a
    dataset stores them (input ids, loss mask on the answer, features per point, final-norm states)."""
    target = tiny_targets["mistral"]
    tok = target.tokenizer
    prompts = [encode(tok, render(tok, [{"role": "user", "content": p}], add_generation_prompt=True))
               for p in PROMPTS[:4]]
    answers = [greedy_reference(target, p, NEW) for p in prompts]
    drafter, points = train_peagle(target, prompts, answers, steps=40)
    samples = []
    for p, a in zip(prompts, answers, strict=True):
        with torch.no_grad():
            store = capture(target.model, torch.tensor([p + a]), [*points, FINAL_NORM])
        samples.append({"input_ids": torch.tensor(p + a), "loss_mask": torch.tensor([0] * len(p) + [1] * len(a)).bool(),
                        "features": torch.stack([store[q.name][0] for q in points], 1),  # [T, A, H]
                        "target_hidden": store[FINAL_NORM.name][0]})
    return target, drafter, points, prompts, answers, samples


def test_offline_parallel_walk_equals_online_parallel_decoding(walked):
    target, drafter, points, prompts, answers, samples = walked
    online = []
    for p, a in zip(prompts, answers, strict=True):
        r = ParallelEngine(target, drafter, points).generate(p, SpecConfig(mode="chain", depth=K, max_new_tokens=len(a)))
        assert r.token_ids[:len(a)] == a  # the stored answer is the target's greedy one: the walk replays decoding
        online.append([s.accepted for s in r.metrics.steps])
    stats = parallel_chain_stats(drafter, samples, target.model.get_output_embeddings().weight, len(samples), K)
    assert stats["per_sample"] == [[sum(r), len(r)] for r in online]
    flat = [x for r in online for x in r]
    assert stats["accepted_per_position"] == [sum(x > k for x in flat) for k in range(K)]
    assert stats["accepted_per_position"][1] > 0  # a mask slot's draft is accepted: the slots are walked, not 0 == 0


def test_points_pick_the_dataset_slots_or_are_refused(walked):
    """With the dataset's points named, the drafter's slots are picked among extra stored ones, in its order."""
    target, drafter, points, _, _, samples = walked
    head = target.model.get_output_embeddings().weight
    plain = parallel_chain_stats(drafter, samples, head, 2, K)
    extra = [{**s, "features": torch.cat([s["features"][:, :1] * 0, s["features"]], 1)} for s in samples]
    names = ["layers.0.out", *[q.name for q in points]]
    ds = _Listed(extra, names)
    picked = parallel_chain_stats(drafter, ds, head, 2, K, [q.name for q in points])
    assert picked["per_sample"] == plain["per_sample"]
    with pytest.raises(EaglewireError, match=r"the P-EAGLE drafter reads \['layers.9.out'\]"):
        parallel_chain_stats(drafter, ds, head, 1, K, ["layers.9.out"])


class _Listed(list):
    """A list of samples with a dataset's manifest (the points it stores, in slot order)."""

    def __init__(self, samples, names):
        super().__init__(samples)
        self.manifest = SimpleNamespace(points=[Point.parse(n) for n in names])
