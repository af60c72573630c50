"""Stored features equal each sample's own forward on the families with their own attention or routing.

`data build` captures padded batches; a family whose attention (GPT-OSS's sinks, sliding windows) or
routing treats padded positions differently would store other features than its own forward. The
reference is transformers' forward of each sample alone, unpadded, uncached.
"""

from __future__ import annotations

import json

import pytest
import torch

from eaglewire.data.config import DataBuildConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.pipeline import run_build
from eaglewire.targets.capture import capture
from eaglewire.targets.load import load_target
from eaglewire.targets.points import FINAL_NORM, Point
from eaglewire_testing.tinydata import USER_PROMPTS

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("arch", ["gpt_oss"])  # attention sinks and windows under right padding
def test_padded_batches_store_each_samples_own_features(tmp_path, arch):
    t = load_target(f"tiny:{arch}")
    prompts = tmp_path / "p.jsonl"  # prompts of different lengths: batches are padded
    prompts.write_text("".join(json.dumps({"prompt": p * (1 + i % 3)}) + "\n" for i, p in enumerate(USER_PROMPTS[:4])))
    out = tmp_path / "ds"
    run_build(DataBuildConfig(out=out, target=f"tiny:{arch}", prompts=prompts, max_new_tokens=8, batch_size=4,
                              store_dtype="fp32", device="cpu"))
    ds = FeatureDataset(out)
    pts = [Point.parse(n) for n in json.loads((out / "manifest.json").read_text())["points"]["names"]]
    lengths = set()
    for i in range(len(ds)):
        x = ds[i]
        lengths.add(len(x["input_ids"]))
        ref = capture(t.model, x["input_ids"][None], pts + [FINAL_NORM])
        for j, p in enumerate(pts):
            torch.testing.assert_close(x["features"][:, j], ref[p.name][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(x["target_hidden"], ref[FINAL_NORM.name][0], atol=1e-5, rtol=1e-4)
    assert len(lengths) > 1  # the batch really was padded
