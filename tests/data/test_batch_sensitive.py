"""DeepSeek-V3.2's stored features equal a fresh forward of each sample, though its indexer is batch-sensitive.

transformers 5.24's V3.2 indexer selects its top-k keys (index_topk) among padded
positions under right padding and among the cache's on a decode step, so a
sample longer than index_topk would store other features than its own forward.
The reference is transformers' forward of each sample alone, unpadded, uncached.
"""

from __future__ import annotations

import json

import pytest
import torch

from eaglewire.data.config import DataBuildConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.gencapture import why_not
from eaglewire.data.pipeline import run_build
from eaglewire.targets.capture import capture
from eaglewire.targets.families import batch_sensitive
from eaglewire.targets.load import load_target
from eaglewire.targets.points import FINAL_NORM, Point
from eaglewire_testing.tinydata import USER_PROMPTS

pytestmark = pytest.mark.unit


def test_v32_features_equal_each_samples_own_forward(tmp_path):
    t = load_target("tiny:deepseek_v32")
    assert batch_sensitive(t.config) and why_not(t.config)  # no capture during cached generation
    prompts = tmp_path / "p.jsonl"  # prompts of different lengths: batches are padded
    prompts.write_text("".join(json.dumps({"prompt": p * (1 + i % 3)}) + "\n" for i, p in enumerate(USER_PROMPTS[:6])))
    out = tmp_path / "ds"
    run_build(DataBuildConfig(out=out, target="tiny:deepseek_v32", prompts=prompts, max_new_tokens=12, batch_size=4,
                              store_dtype="fp32", device="cpu"))
    ds = FeatureDataset(out)
    names = json.loads((out / "manifest.json").read_text())["points"]["names"]
    pts = [Point.parse(n) for n in names]
    longer = 0
    for i in range(len(ds)):
        x = ds[i]
        ids = x["input_ids"]
        longer += len(ids) > t.config.index_topk
        ref = capture(t.model, ids[None], pts + [FINAL_NORM])
        for j, p in enumerate(pts):
            torch.testing.assert_close(x["features"][:, j], ref[p.name][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(x["target_hidden"], ref[FINAL_NORM.name][0], atol=1e-5, rtol=1e-4)
    assert longer == len(ds) > 0  # every sample is longer than index_topk: the indexer really selects
