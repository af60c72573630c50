"""The options of `eaglewire plan`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from eaglewire.data.config import VOCAB_SIZE_HELP, ExtractSettings
from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.plan.hardware import DEVICES
from eaglewire.targets.points import POINTS_HELP
from eaglewire.training.config import TrainConfig

GIB = 1024 ** 3

# A serving engine batches generation far wider than `data generate`'s in-process default
# (GenSettings.batch_size); plan sizes that larger batch unless told otherwise.
PLAN_GEN_BATCH = 64


# `train`'s defaults: plan sizes the run those commands make when given the same flags.
TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


@dataclass
class PlanConfig:
    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir or a .gguf file (only its config is read)")
    hf_config: Path | None = opt(None, "an HF config.json (or its directory) to size instead of --target: no weights needed",
                                 flag="--model-config")
    samples: int = opt(10000, "training conversations", ge=1)
    seq_len: int = opt(2048, "tokens per conversation (prompt + answer)", ge=2)
    new_tokens: int = opt(0, "generated answer tokens per conversation; 0 = 3/4 of --seq-len", ge=0)
    points: list[str] = opt(help="capture points (repeat or comma-separate): " + POINTS_HELP, factory=list)
    store_dtype: str = opt(ExtractSettings.dtype, "feature storage dtype", choices=("fp32", "bf16", "fp16"))
    device: str = opt("auto", "where the target and the drafter run: a GPU by name (" + ", ".join(DEVICES) + ": its "
                      "memory, peak and bandwidth), cuda (a GPU, assumed an H100 unless --device-memory-gib), or cpu "
                      "(fp32); auto: cuda when this machine has one, else cpu. Only sizes: no GPU is needed here",
                      choices=("auto", "cpu", "cuda", *DEVICES), aliases=("--device-type",))
    gpus: int = opt(1, "devices sharing the work (ideal scaling assumed)", ge=1)
    gpus_per_node: int = opt(8, "devices per node (how many nodes a capture through vLLM spans)", ge=1)
    gen_batch_size: int = opt(PLAN_GEN_BATCH, "generation batch size (`data generate --gen-batch-size`; default: "
                              "what a serving engine batches, wider than data generate's own)", ge=1,
                              aliases=("--gen-batch",))
    batch_tokens: int = opt(ExtractSettings.batch_tokens, "padded tokens per extraction forward", ge=1)
    shard_samples: int = opt(ExtractSettings.shard_samples, "samples per feature shard", ge=1)
    epochs: int = opt(TRAIN_DEFAULTS["epochs"], "training epochs (train --epochs)", ge=1)
    batch_size: int = opt(TRAIN_DEFAULTS["batch_size"], "training samples per micro-batch (train --batch-size)", ge=1,
                          aliases=("--train-batch",))
    ttt_steps: int = opt(TRAIN_DEFAULTS["ttt_steps"], "training-time-test steps", ge=1)
    max_len: int = opt(TRAIN_DEFAULTS["max_len"], "train --max-len: longer samples are truncated for training", ge=3,
                       aliases=("--train-max-len",))
    vocab_size: int = opt(0, VOCAB_SIZE_HELP, ge=0, aliases=("--draft-vocab",))
    intermediate_size: int = opt(TRAIN_DEFAULTS["intermediate_size"], "the drafter's MLP width (train "
                                 "--intermediate-size); 0 = the target's", ge=0)
    freeze_head: bool = opt(False, "the drafter's lm_head is frozen (train --freeze-head)")
    gpu_tflops: float = opt(0.0, "peak dense bf16 TFLOP/s of one device; 0: the named --device's datasheet "
                            "(H100/H200: 989)", ge=0)
    gpu_bandwidth_gbs: float = opt(0.0, "peak memory bandwidth of one device in GB/s; 0: the named --device's "
                                   "datasheet (H100: 3350, H200: 4800)", ge=0)
    device_memory_gib: float = opt(0.0, "memory of one device in GiB (for the fits verdicts); 0: the named "
                                   "--device's (cuda: an H100's, said as assumed), this machine's RAM with --device cpu",
                                   ge=0)
    measured: Path | None = opt(None, "a benchmarks/gpu_check.py result (JSON): training time from its measured "
                                "bf16 throughput instead of the unmeasured datasheet-peak bound")
    json: bool = json_flag()
