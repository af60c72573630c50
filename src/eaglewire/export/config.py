"""Options of the `export` and `import` commands, torch-free so that building the CLI stays fast."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.saved.depth import DEPTH  # the one default depth (see there)
from eaglewire.targets.registry import ENGINES


@dataclass
class ExportConfig:
    ckpt: Path = opt(help="eaglewire drafter checkpoint directory (train's out/drafter)", arg=True)
    format: str = opt(help="sglang (also SpecForge), vllm, speculators, eagle (official SafeAILab/EAGLE), "
                      "gguf (llama.cpp)")
    out: Path = opt(help="output directory (must not exist unless --force)")
    engine_version: str = opt("", "version of the engine that will serve it (sglang: ids mean different layers "
                              "from 0.5.13 on DeepSeek-family targets); default: the newest verified")
    verifier: str = opt("", "speculators and gguf: the verifier's (target's) HF id or model directory (speculators "
                        "loads it; llama.cpp's converter reads its tokenizer); default: the target the checkpoint records (its hub id, or the local directory it was loaded from)")
    depth: int = opt(0, "speculators: draft tokens per round recorded in speculators_config (its "
                     f"speculative_tokens); 0: the drafter's own (a P-EAGLE drafter's trained depths, else {DEPTH})",
                     ge=0, aliases=("--speculative-tokens",))
    gguf_type: str = opt("f16", "gguf: the drafter's tensor type (f32, f16, bf16, q8_0)")
    target_gguf: str = opt("", "gguf: also convert the target to GGUF of this type (f32, f16, bf16, q8_0), "
                           "cached; for when you have no GGUF of it")
    force: bool = opt(False, "replace --out if it exists")
    json: bool = json_flag()


@dataclass
class ImportConfig:
    src: Path = opt(help="directory holding config.json and the weights", arg=True)
    out: Path = opt(help="eaglewire checkpoint directory to write")
    target: str = opt("", "target the drafter serves: gives the layer count, the embedding if missing, the fingerprint")
    target_layers: int = opt(0, "the target's decoder layer count when --target is not given (needed to resolve ids)")
    layers_from: str = opt("", f"engine meaning of the stored ids ({', '.join(ENGINES)}); default: the format's own")
    arch: str = opt("", "the target's class or model_type when --target is not given (e.g. "
                    "KimiK25ForConditionalGeneration, deepseek_v3): SGLang >= 0.5.13 reads ids per target family")
    format: str = opt("auto", "auto, sglang (SpecForge), vllm, speculators, eagle")
    force: bool = opt(False, "replace --out if it exists")
    json: bool = json_flag()
