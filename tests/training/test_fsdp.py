"""`--parallel fsdp` (FSDP2, gloo on CPU) trains as DDP and one process do, and its whole saved state resumes
under DDP and from DDP's.

The references are a single process over the same global batch (the trajectory) and DDP's own saved state
at the same step (the file format); three torchrun launches in all.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train

# eval_every=1: every FSDP2 step after the first follows a validation on the gathered weights
KW = dict(lr=2e-3, warmup_steps=2, save_every=2, val_fraction=0.1, ttt_steps=3, max_len=96, max_steps=4, eval_every=1)


def _rows(out, split="train"):
    with open(out / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == split]


def _torchrun(data, out, parallel: str, port: int, stop_after: int = 0, resume: bool = False):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "eaglewire.cli", "train", "--data", str(data), "--out", str(out), "--device", "cpu",
           "--batch-size", "2", "--parallel", parallel, *[f"--{k.replace('_', '-')}={v}" for k, v in KW.items()],
           *(["--resume"] if resume else [])]
    env = dict(os.environ, OMP_NUM_THREADS="1", EAGLEWIRE_STOP_AFTER=str(stop_after))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if stop_after:
        assert "stopped after step 2" in r.stderr, r.stderr[-3000:]
    else:
        assert r.returncode == 0, r.stderr[-3000:]


def _same_losses(ref_dir, got_dir, steps):
    ref, got = _rows(ref_dir) + _rows(ref_dir, "val"), _rows(got_dir) + _rows(got_dir, "val")
    assert len(got) == 2 * steps
    for x, y in zip(ref[:steps] + ref[4:4 + steps], got):
        assert float(x["loss"]) == pytest.approx(float(y["loss"]), rel=1e-5), x["step"]
        assert float(x["acc_0"]) == pytest.approx(float(y["acc_0"]), abs=1e-9), x["step"]


def test_fsdp_matches_ddp_and_one_process_and_resumes_across_them(tiny_dataset, tmp_path):
    single = tmp_path / "single"
    run_train(TrainConfig(data=tiny_dataset, out=single, device="cpu", batch_size=4, **KW))
    assert len(_rows(single)) == len(_rows(single, "val")) == 4
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    _torchrun(tiny_dataset, ddp, "ddp", 29531, stop_after=2)
    ddp_at_2 = tmp_path / "ddp-at-2"
    shutil.copytree(ddp / "state", ddp_at_2)
    _torchrun(tiny_dataset, ddp, "fsdp", 29533, resume=True)  # DDP's state, sharded, trained on under FSDP2
    _same_losses(single, ddp, 4)
    ma, _ = load_checkpoint(single / "drafter")
    mb, _ = load_checkpoint(ddp / "drafter")
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=2e-5, rtol=1e-4, msg=k)
    _torchrun(tiny_dataset, fsdp, "fsdp", 29535, stop_after=2)  # from scratch under FSDP2
    _same_losses(single, fsdp, 2)
    # FSDP2's saved state is whole and in DDP's format: what DDP saves at the same step, to float tolerance
    a, b = load_file(str(ddp_at_2 / "model.safetensors")), load_file(str(fsdp / "state" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    oa = torch.load(ddp_at_2 / "optimizer.pt", weights_only=True)
    ob = torch.load(fsdp / "state" / "optimizer.pt", weights_only=True)
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            torch.testing.assert_close(v, ob["state"][i][k], atol=1e-6, rtol=1e-3, msg=f"{i}.{k}")
