"""The options of the `eaglewire doctor` commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.saved.depth import DEPTH
from eaglewire.targets.points import DEFAULT_ENGINE
from eaglewire.targets.producers import PRODUCER_HELP
from eaglewire.targets.vllm_pp import PP_HELP


@dataclass
class DoctorDatasetConfig:
    data: Path = opt(help="dataset directory (ours or imported)", arg=True)
    target: str = opt("", "target to recompute features with; default: the one in the manifest")
    samples: int = opt(4, "samples to check", ge=1)
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    json: bool = json_flag()


@dataclass
class DoctorDrafterConfig:
    ckpt: Path = opt(help="drafter checkpoint (eaglewire) or training run directory", arg=True)
    data: Path = opt(help="dataset captured at the drafter's points")
    target: str = opt("", "target (for its lm_head); default: the drafter's provenance")
    samples: int = opt(64, "samples to evaluate (from the held-out split when --data is the training dataset)", ge=1)
    depth: int = opt(DEPTH, "draft tokens per round of the offline mean acceptance length (vLLM's "
                     "num_speculative_tokens)", ge=1)
    json: bool = json_flag()


@dataclass
class DoctorEngineConfig:
    drafter_dir: Path = opt(help="the draft model directory as deployed (config.json + weights)", arg=True)
    engine: str = opt("", "engine that will serve it, optionally with its version: sglang, sglang==0.5.23, "
                      "vllm==0.32.0, speculators (no version: the newest verified version's rule, and the report says where "
                      "older versions read the ids otherwise); default: the engine "
                      "the export was written for (its eaglewire.export.json); required for a directory made elsewhere")
    arch: str = opt("", "target architecture or model_type (SGLang >= 0.5.13 reads ids differently on DeepSeek-family "
                    "targets); default: from --target, else from the drafter's provenance")
    trained_on: Path | None = opt(None, "eaglewire checkpoint the drafter came from (default: eaglewire.json in the dir)")
    trained_with: str = opt("", PRODUCER_HELP + "; its ids are read as that producer read them at that version. "
                            "Nothing known of training: each reading is shown and the verdict is UNKNOWN (exit 3)")
    trained_points: list[str] = opt(help="the physical points the drafter was trained on (repeat or comma-separate), "
                                    "e.g. layers.2.out,layers.30.out,layers.58.out", factory=list)
    target: str = opt("", "serving target (gives L and the serving chat template)")
    target_layers: int = opt(0, "the target's decoder layer count when --target is not given",
                             aliases=("--num-layers",))
    pipeline_parallel_size: int = opt(1, PP_HELP + " (vllm, speculators; needs the target's class)", ge=1)
    json: bool = json_flag()


@dataclass
class DoctorOnlineConfig:
    drafter: Path = opt(help="drafter checkpoint or training run directory")
    data: Path = opt(help="dataset the drafter was trained on (its prompts and features are the reference)")
    target: str = opt("", "target; default: the drafter's provenance")
    serve_ids: list[int] = opt(help="simulate serving with these ids (in --layers-from's meaning) instead of the "
                               "trained points", factory=list)
    layers_from: str = opt(DEFAULT_ENGINE, "engine meaning of --serve-ids: hf, sglang, specforge, vllm, speculators "
                           "(optionally ==VERSION)", aliases=("--engine",))
    samples: int = opt(4, "dataset samples to decode", ge=1)
    max_new_tokens: int = opt(48, "tokens to decode per sample")
    depth: int = opt(DEPTH, "draft tokens per round, online and in the offline tau it is compared with", ge=1)
    json: bool = json_flag()


@dataclass
class DoctorLiveConfig:
    server: str = opt(help="URL of the running engine, e.g. http://127.0.0.1:8000 (vLLM)")
    drafter: Path = opt(help="the eaglewire checkpoint or training run the server's drafter was exported from")
    target: str = opt("", "the served target (same weights) for eaglewire's prediction; default: the drafter's provenance")
    served_drafter: Path | None = opt(None, "directory the server loaded as its drafter, checked on a FAIL; default: the "
                                      "export `eaglewire serve` recorded")
    prompts: Path | None = opt(None, "JSONL prompts; default: the shipped held-out set")
    num_prompts: int = opt(8, "prompts to send (round-robin over categories)", ge=1)
    max_new_tokens: int = opt(64, "tokens per prompt", ge=1)
    data: Path | None = opt(None, "for a target too big to run here: a dataset built from the prompts to send "
                            "(`data build --prompts`); its prompts are sent, and the prediction is the offline "
                            "acceptance on its stored features (an estimate: catches collapsed acceptance, not a "
                            "slightly shifted slot)")
    p_min: float | None = opt(None, "llama.cpp: the server's --spec-draft-p-min (llama-server does not report it); the "
                              "prediction stops drafting where llama.cpp does; default: the gate `eaglewire serve` "
                              "recorded for this run (its serve.json), else 0", ge=0, lt=1)
    deadline: float = opt(900.0, "seconds the whole check may take once the server is contacted (every request "
                          "to it and eaglewire's prediction); a server too slow for it ends in one line saying how "
                          "far the check got", gt=0, le=86400)
    json: bool = json_flag()
