"""The options of the commands about the target: `inspect`, `layers`, `capture`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.targets.points import POINTS_HELP
from eaglewire.targets.vllm_pp import PP_HELP


@dataclass
class InspectConfig:
    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a hub id (org/name) in the local HF cache")
    device: str = opt("auto", "auto (CUDA when available), cpu, cuda, cuda:N")
    json: bool = json_flag()


@dataclass
class LayersConfig:
    ids: list[int] = opt(help="layer ids in the --layers-from engine's meaning", arg=True)
    target_layers: int = opt(help="the target's decoder layer count (L)", aliases=("--num-layers",))
    layers_from: str = opt(help="engine whose meaning the ids have: hf, eagle, sglang, specforge, vllm, speculators; "
                           "optionally ==VERSION (sglang==0.5.12 reads every id with +1). Required: an id means "
                           "nothing without its engine", aliases=("--from",))
    arch: str = opt("", "target architecture or model_type of the --layers-from engine (matters for SGLang >= 0.5.13 "
                    "on DeepSeek-family targets, and for vLLM over pipeline stages or in its Transformers backend)")
    pipeline_parallel_size: int = opt(1, PP_HELP + "; adds the vLLM ids for that split (needs --arch)", ge=1)
    json: bool = json_flag()


@dataclass
class CaptureConfig:
    text: str = opt(help="text to run through the target")
    out: Path = opt(help="output .safetensors file: one [T, H] tensor per point, plus input_ids")
    points: list[str] = opt(help="physical points (repeat or comma-separate): " + POINTS_HELP, factory=list)
    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a hub id (org/name) in the local HF cache")
    chat: bool = opt(False, "wrap the text as a user turn with the target's chat template (generation prompt added)")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("fp32", "model dtype: fp32, bf16, fp16, auto")
    json: bool = json_flag()
