"""Features kept while generating equal a plain forward of each finished sample, or are not used.

The reference is one unpadded forward of the sample alone (`targets.capture`,
batch 1), as extraction's own tests use. Batches mix rows cut by the token
budget with rows that ended early (an end token forced from what the tiny
target says often), so the padding generate writes after an early end and
the tokens generate never fed both occur.
"""

import json
from collections import Counter

import pytest
import torch

from eaglewire.data.config import DataBuildConfig, GenSettings
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.extract import InProcessCapture, tokenize_rows
from eaglewire.data.gencapture import GENCAPTURE, GenCapture, GenCaptured, why_not
from eaglewire.data.generate import generate_responses
from eaglewire.data.jsonl import read_jsonl
from eaglewire.data.pipeline import run_build
from eaglewire.data.prompts import Conversation
from eaglewire.targets.capture import capture
from eaglewire.targets.points import FINAL_NORM, point_option
from eaglewire_testing.tinydata import USER_PROMPTS

NEW = 24


def _convs():
    return [Conversation(messages=[{"role": "user", "content": p}]) for p in USER_PROMPTS]


def _often_said(t, tmp_path) -> int:
    """A token the target emits mid-answer on these prompts: used as an end token, rows end early."""
    rows = _generate(t, tmp_path / "probe", None)
    return Counter(x for r in rows for x in r["answer_ids"][2:]).most_common(1)[0][0]


def _generate(t, d, cap) -> list[dict]:
    d.mkdir(parents=True, exist_ok=True)
    generate_responses(t, _convs(), d / "responses.jsonl", GenSettings(max_new_tokens=NEW, batch_size=5), capture=cap)
    return [r for r in read_jsonl(d / "responses.jsonl") if "messages" in r]


def _assert_single_forward(t, pts, items, got):
    want = pts + [FINAL_NORM]
    for (_, ids, _), (f, h) in zip(items, got):
        ref = capture(t.model, torch.tensor([ids]), want)
        for j, p in enumerate(pts):
            torch.testing.assert_close(f[:, j], ref[p.name][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(h, ref[FINAL_NORM.name][0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_generation_features_equal_a_forward_of_each_sample(tiny_targets, tmp_path, monkeypatch, arch):
    t = tiny_targets[arch]
    pts = point_option([], t.num_layers)
    monkeypatch.setattr(t, "eos_ids", lambda end=_often_said(t, tmp_path): [end])
    cap = GenCapture(t, tmp_path / "ds", pts, "fp32")
    rows = _generate(t, tmp_path / "ds", cap)
    finish = Counter(r["finish"] for r in rows)
    assert finish["eos"] and finish["length"], finish  # both kinds of row in the batches
    items, _ = tokenize_rows(t.tokenizer, rows, 4096)
    kept = GenCaptured(InProcessCapture(t, pts), tmp_path / "ds", t, pts, "fp32")
    got = kept(items)
    assert kept.used == len(items) == len(rows)  # every row was taken from generation
    _assert_single_forward(t, pts, items, got)


def test_a_row_whose_ids_changed_takes_the_forward(tiny_targets, tmp_path):
    t = tiny_targets["llama"]
    pts = point_option([], t.num_layers)
    d = tmp_path / "ds"
    rows = _generate(t, d, GenCapture(t, d, pts, "fp32"))
    rows[3]["answer_ids"] = rows[3]["answer_ids"][:-2] + [7, 8]  # as if regenerated after a kill
    items, _ = tokenize_rows(t.tokenizer, rows, 4096)
    kept = GenCaptured(InProcessCapture(t, pts), d, t, pts, "fp32")
    got = kept(items)
    assert kept.used == len(items) - 1
    _assert_single_forward(t, pts, items, got)
    # other points, another storage dtype: nothing is taken from the folder
    other = point_option(["layers.0.out", "layers.2.out", "layers.5.out"], t.num_layers)
    assert GenCaptured(InProcessCapture(t, other), d, t, other, "fp32").entries == {}
    assert GenCaptured(InProcessCapture(t, pts), d, t, pts, "bf16").entries == {}


def _build(tmp_path, name, gen_capture, target="tiny:llama"):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in USER_PROMPTS))
    out = tmp_path / name
    run_build(DataBuildConfig(out=out, target=target, prompts=prompts, max_new_tokens=NEW, batch_size=4,
                              store_dtype="fp32", device="cpu", gen_capture=gen_capture))
    return out


def test_build_with_and_without_capture_during_generation_agree(tmp_path):
    on, off = _build(tmp_path, "on", True), _build(tmp_path, "off", False)
    assert not (on / GENCAPTURE).exists()  # a cache: gone once the shards hold everything
    man_on, man_off = (json.loads((d / "manifest.json").read_text()) for d in (on, off))
    assert man_on["capture"]["during_generation"] == man_on["num_samples"] > 0
    assert "during_generation" not in man_off["capture"]
    a, b = FeatureDataset(on), FeatureDataset(off)
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert x["loss_mask"].tolist() == y["loss_mask"].tolist()
        torch.testing.assert_close(x["features"], y["features"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(x["target_hidden"], y["target_hidden"], atol=1e-5, rtol=1e-4)


def test_sliding_window_targets_keep_the_second_forward(tiny_targets, tmp_path, monkeypatch):
    assert why_not(tiny_targets["qwen3"].model.config) and why_not(tiny_targets["mistral"].model.config)
    assert why_not(tiny_targets["llama"].model.config) is None
    made = []
    monkeypatch.setattr(GenCapture, "__init__", lambda self, *a, **k: made.append(1) or None)
    out = _build(tmp_path, "qwen3", True, target="tiny:qwen3")
    assert not made and "during_generation" not in json.loads((out / "manifest.json").read_text())["capture"]

