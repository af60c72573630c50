"""`--precision`: bf16 autocast over fp32 master weights (TF32 with it on CUDA), fp32 on CPU unless asked;
recorded in train.config.json and shown in --help."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train
from eaglewire.training.precision import apply_precision, resolve_precision

pytestmark = pytest.mark.unit
KW = dict(device="cpu", batch_size=4, ttt_steps=2, max_len=64, max_steps=2, val_fraction=0.0, warmup_steps=1,
          lr=2e-3)


def _losses(out):
    with open(out / "metrics.csv") as f:
        return [float(r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]


def test_auto_is_bf16_with_tf32_on_cuda_and_fp32_on_cpu():
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert apply_precision("auto", torch.device("cuda", 0)) == "bf16"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert apply_precision("fp32", torch.device("cuda", 0)) == "fp32"  # strict fp32: no TF32 either
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_bf16_autocast_trains_fp32_master_weights_close_to_fp32(tiny_dataset, tmp_path):
    run_train(TrainConfig(data=tiny_dataset, out=tmp_path / "fp32", **KW))
    run_train(TrainConfig(data=tiny_dataset, out=tmp_path / "bf16", precision="bf16", **KW))
    a, b = _losses(tmp_path / "fp32"), _losses(tmp_path / "bf16")
    assert a != b  # the forward really ran in bf16 ...
    assert b == pytest.approx(a, rel=2e-2)  # ... to bf16's rounding of the same computation
    model, prov = load_checkpoint(tmp_path / "bf16" / "drafter")
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights
    assert prov.training["config"]["precision"] == "bf16"
    saved = json.loads((tmp_path / "bf16" / "train.config.json").read_text())
    assert saved["config"]["precision"] == "bf16" and saved["config"]["parallel"] == "ddp"


def test_help_shows_precision_and_parallel():
    out = subprocess.run([sys.executable, "-m", "eaglewire.cli", "train", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    assert "--precision" in out and "--parallel" in out and "fsdp" in out
