"""Extraction: provenance, batch==single, crash safety by killing a real process, refusals."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.data.extract import ExtractSettings, extract
from eaglewire.data.jsonl import rewrite_jsonl
from eaglewire.data.lossmask import render_with_mask
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.points import FINAL_NORM, Point

WORDS = "the quick brown fox jumps over lazy dog hello world robot paint story sea boat fish sky blue".split()


def make_rows(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        u = " ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (3 + i % 5,), generator=g).tolist())
        a = " ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (4 + (i * 7) % 23,), generator=g).tolist())
        rows.append({"index": i, "messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]})
    return rows


POINTS = ["layers.1.out", "layers.3.out", "layers.6.out"]


def test_extract_matches_single_sample_capture(tiny_targets, tmp_path):
    t = tiny_targets["qwen3"]
    rows = make_rows(12)
    s = ExtractSettings(points=POINTS, dtype="fp32", batch_tokens=200, shard_samples=5)
    extract(t, rows, tmp_path, s, gen={})
    man = json.loads((tmp_path / "manifest.json").read_text())  # what other tools read
    assert man["complete"] and man["num_samples"] == 12 and len(man["shards"]) == 3
    assert man["points"]["names"] == POINTS and man["points"]["sglang"] == [1, 3, 6]
    assert man["points"]["vllm"] == [2, 4, 7]
    ds = FeatureDataset(tmp_path)
    pts = [Point.parse(p) for p in POINTS] + [FINAL_NORM]
    for i, r in enumerate(rows):
        ids, mask = render_with_mask(t.tokenizer, r["messages"])
        item = ds[i]
        assert item["input_ids"].tolist() == ids and item["loss_mask"].int().tolist() == mask
        ref = capture(t.model, torch.tensor([ids]), pts)
        for j, p in enumerate(POINTS):
            torch.testing.assert_close(item["features"][:, j], ref[p][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(item["target_hidden"], ref["final_norm"][0], atol=1e-5, rtol=1e-4)
    b = collate([ds[0], ds[1]])
    assert b["features"].shape[2:] == (3, t.hidden_size) and b["attention_mask"].sum() == len(ds[0]["input_ids"]) + len(ds[1]["input_ids"])


def test_refuses_existing_and_mismatched_resume(tiny_targets, tmp_path):
    rows = make_rows(4)
    s = ExtractSettings(points=POINTS, dtype="bf16", batch_tokens=400, shard_samples=2)
    extract(tiny_targets["llama"], rows, tmp_path, s, gen={})
    with pytest.raises(EaglewireError, match="already holds a dataset"):
        extract(tiny_targets["llama"], rows, tmp_path, s, gen={})
    with pytest.raises(EaglewireError, match="different target"):
        extract(tiny_targets["mistral"], rows, tmp_path, s, gen={}, resume=True)
    s2 = ExtractSettings(points=["embed", "layers.3.out", "layers.6.out"], dtype="bf16", batch_tokens=400, shard_samples=2)
    with pytest.raises(EaglewireError, match="different capture points"):
        extract(tiny_targets["llama"], rows, tmp_path, s2, gen={}, resume=True)


def test_corrupt_shard_is_named(tiny_targets, tmp_path):
    extract(tiny_targets["llama"], make_rows(4), tmp_path, ExtractSettings(points=POINTS, shard_samples=2), gen={})
    shard = tmp_path / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(EaglewireError, match="shard-00001.safetensors: checksum mismatch"):
        FeatureDataset(tmp_path)
    shard.write_bytes(bytes(data[:100]))
    with pytest.raises(EaglewireError, match="shard-00001.safetensors: truncated"):
        FeatureDataset(tmp_path)


def _extract_cmd(d):
    return [sys.executable, "-m", "eaglewire.cli", "data", "extract", str(d), "--target", "tiny:llama",
            "--points", ",".join(POINTS), "--store-dtype", "fp32", "--batch-tokens", "300",
            "--shard-samples", "4", "--device", "cpu", "--json"]


def test_killed_extraction_resumes_without_loss_or_duplicates(tmp_path):
    rows = make_rows(40)
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "kill"
    for d in (ref_dir, kill_dir):
        d.mkdir()
        rewrite_jsonl(d / "responses.jsonl", rows)
    env = dict(os.environ, EAGLEWIRE_SHARD_DELAY="0.4")
    p = subprocess.Popen(_extract_cmd(kill_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        m = kill_dir / "manifest.json"
        if m.exists() and len(json.loads(m.read_text())["shards"]) >= 3:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    man = json.loads((kill_dir / "manifest.json").read_text())
    assert not man["complete"] and 3 <= len(man["shards"]) < 10
    r = subprocess.run(_extract_cmd(kill_dir) + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(_extract_cmd(ref_dir), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    a, b = FeatureDataset(kill_dir), FeatureDataset(ref_dir)
    ia = [i for s in a.manifest.shards for i in s["indices"]]
    assert sorted(ia) == list(range(40)) and len(ia) == len(set(ia))
    assert len(a) == len(b) == 40
    by_idx = {i: k for k, i in enumerate(ia)}
    ib = [i for s in b.manifest.shards for i in s["indices"]]
    for k, i in enumerate(ib):
        x, y = a[by_idx[i]], b[k]
        assert torch.equal(x["input_ids"], y["input_ids"])
        torch.testing.assert_close(x["features"], y["features"], atol=1e-5, rtol=1e-4)
    ns_a, ns_b = a.manifest.norm_stats, b.manifest.norm_stats
    assert ns_a[0]["num_tokens"] == ns_b[0]["num_tokens"]
