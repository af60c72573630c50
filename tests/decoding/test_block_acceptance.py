"""The offline DFlash walk (held-out acceptance without the target) equals online block decoding, round for round.

The reference is independent: `BlockEngine` runs the target and verifies each block; the offline walk only
reads the stored answers and features. A drafter wired to other layers than the dataset stores is refused.
"""

from __future__ import annotations

import json

import pytest
import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.decoding.block_acceptance import block_chain_stats
from eaglewire.decoding.dflash import BlockEngine
from eaglewire.decoding.engine import SpecConfig
from eaglewire.infra.errors import EaglewireError

pytestmark = pytest.mark.unit
MAX_NEW = 32


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    from eaglewire.data.config import DataExtractConfig, DataGenerateConfig
    from eaglewire.data.pipeline import run_extract, run_generate
    from eaglewire_testing.dflash_serving import build_dflash_run

    root = tmp_path_factory.mktemp("block_walk")
    run = build_dflash_run(root, steps=300)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ("Name three colours.", "Count to ten.", "What is a cat?", "Say hello twice.")))
    ds = root / "ds"
    run_generate(DataGenerateConfig(out=ds, target=str(run["target"]), prompts=prompts, max_new_tokens=MAX_NEW,
                                    batch_size=4, device="cpu"))
    run_extract(DataExtractConfig(data=ds, target=str(run["target"]), store_dtype="fp32", device="cpu",
                                  points=["layers.1.out,layers.3.out,layers.5.out"]))
    return run, FeatureDataset(ds, verify=False)


def _online(run, sample) -> list[int]:
    ids = sample["input_ids"].tolist()
    first = int(torch.nonzero(sample["loss_mask"])[0])
    answer = ids[first:]
    r = BlockEngine(run["loaded"], run["drafter"]).generate(ids[:first], SpecConfig(mode="chain", depth=3,
                                                                                     max_new_tokens=len(answer)))
    n = min(len(answer), MAX_NEW)  # a truncated answer is stored with the template's end-of-turn token after it
    assert r.token_ids[:n] == answer[:n]  # the stored answer is the target's greedy one: the walk replays decoding
    return [s.accepted for s in r.metrics.steps]


def test_offline_block_walk_equals_online_block_decoding(walked):
    run, ds = walked
    t = run["loaded"]
    embed_w, head_w = t.model.get_input_embeddings().weight, t.model.get_output_embeddings().weight
    stats = block_chain_stats(run["drafter"], ds, embed_w, head_w, len(ds), 3)
    online = [_online(run, ds[i]) for i in range(len(ds))]
    assert stats["per_sample"] == [[sum(r), len(r)] for r in online]
    flat = [a for r in online for a in r]
    assert stats["mean_acceptance_length"] == pytest.approx(1 + sum(flat) / len(flat))
    assert sum(flat) > 0  # the drafter accepts: the comparison is not 0 == 0


def test_a_drafter_reading_points_the_dataset_lacks_is_refused(walked):
    import dataclasses

    from eaglewire.drafter.dflash import DFlashDrafter

    run, ds = walked
    other = DFlashDrafter(dataclasses.replace(run["drafter"].config, target_layer_ids=(2, 4, 6)))
    t = run["loaded"]
    with pytest.raises(EaglewireError, match=r"reads \['layers.2.out', 'layers.4.out', 'layers.6.out'\]"):
        block_chain_stats(other, ds, t.model.get_input_embeddings().weight, t.model.get_output_embeddings().weight, 1, 3)
