"""`data build` under torchrun: 2 CPU ranks make the same samples as 1 process, one manifest,
resume after a lost rank file and shard, and the lock held for the whole job."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from eaglewire.data.dataset import FeatureDataset


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(tmp_path, n=10):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"Tell me fact number {i} about {w}."})
                           for i, w in enumerate(["rivers", "bees", "tea", "maps", "snow", "glass", "owls",
                                                  "salt", "wind", "clay"][:n])) + "\n")
    return p


def _build_args(prompts, out, *extra):
    return ["data", "build", "--target", "tiny:llama", "--prompts", str(prompts), "--max-new-tokens", "10",
            "--gen-batch-size", "1", "--shard-samples", "2", "--store-dtype", "fp32", "--device", "cpu",
            "--out", str(out), *extra]


def _eaglewire(args, ranks: int = 1):
    launch = [sys.executable, "-m", "eaglewire.cli"] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port()),
        "-m", "eaglewire.cli"]
    return subprocess.run(launch + args, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def _by_index(d) -> dict:
    ds = FeatureDataset(d)
    out = {}
    for k, e in enumerate(ds.manifest.shards):
        for j, idx in enumerate(e["indices"]):
            out[idx] = ds[sum(s["num_samples"] for s in ds.manifest.shards[:k]) + j]
    return out


def _answers(d) -> dict:
    rows = [json.loads(x) for x in (d / "responses.jsonl").read_text().splitlines()]
    assert len(rows) == len({r["index"] for r in rows})  # one row per prompt
    return {r["index"]: r for r in rows}


def _same_samples(a, b):
    sa, sb = _by_index(a), _by_index(b)
    assert sorted(sa) == sorted(sb) and len(sa) > 0
    for i in sa:
        for key in ("input_ids", "loss_mask"):
            assert torch.equal(sa[i][key], sb[i][key]), (i, key)
        for key in ("features", "target_hidden"):
            torch.testing.assert_close(sa[i][key], sb[i][key], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    r = _eaglewire(_build_args(_prompts(tmp), tmp / "d"))
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "d"


def test_two_ranks_make_the_same_samples_as_one_process(single, tmp_path):
    out = tmp_path / "d"
    r = _eaglewire(_build_args(_prompts(tmp_path), out, "--json"), ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["ranks"] == 2 and man["complete"]
    assert {e["file"].split("/")[0] for e in man["shards"]} == {"rank-00000", "rank-00001"}
    for e in man["shards"]:  # each rank took every other prompt
        rank = int(e["file"].split("/")[0][5:])
        assert all(i % 2 == rank for i in e["indices"])
    one = json.loads((single / "manifest.json").read_text())
    for k in ("num_samples", "num_tokens", "num_loss_tokens"):
        assert man[k] == one[k], k
    for a, b in zip(man["norm_stats"], one["norm_stats"]):
        assert a["mean_norm"] == pytest.approx(b["mean_norm"], rel=1e-5)
    assert _answers(out) == _answers(single)
    assert not list(out.glob("responses.rank*.jsonl"))
    assert json.loads((out / "generate.config.json").read_text())["result"]["ranks"] == 2
    _same_samples(single, out)
    # vocab counted over all ranks' samples: identical to one process's
    assert json.loads((out / "vocab.json").read_text()) == json.loads((single / "vocab.json").read_text())

    # A rank's answers lost half-way and one of its shards corrupted: resume under 2 ranks repairs both.
    rows = (out / "responses.jsonl").read_text().splitlines()
    (out / "responses.jsonl").write_text("\n".join(rows[:-3]) + "\n")
    (out / "manifest.json").unlink()
    shard = out / man["shards"][-1]["file"]
    shard.write_bytes(shard.read_bytes()[:-7] + b"garbage")
    r = _eaglewire(_build_args(_prompts(tmp_path), out, "--resume", "--json"), ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _answers(out) == _answers(single)
    _same_samples(single, out)

    # one process cannot resume what 2 ranks own; the message says how
    r = _eaglewire(["data", "extract", str(out), "--resume", "--device", "cpu"])
    assert r.returncode == 2 and "--nproc_per_node 2" in r.stderr and "Traceback" not in r.stderr


def test_second_job_is_refused_by_the_lock(tmp_path):
    from eaglewire.infra.locks import dir_lock

    out = tmp_path / "d"
    with dir_lock(out, "test holder"):
        r = _eaglewire(_build_args(_prompts(tmp_path, 4), out), ranks=2)
    assert r.returncode != 0  # torchrun exits 1 when a rank exits 2
    # Every rank raises (none waits at a collective: the run ends, within the timeout). torchrun
    # SIGTERMs the other rank once one exits, so one or both get to print the message.
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert 1 <= len(errors) <= 2, r.stderr[-2000:]
    assert all(f"PID {os.getpid()}" in e for e in errors)
    assert "[rank0]: Traceback" not in r.stderr and "[rank1]: Traceback" not in r.stderr
    assert not (out / "responses.jsonl").exists()
