"""What the `eaglewire data ...` commands do: the stages' settings and the commands' options.

`GenSettings` and `ExtractSettings` are what generation and extraction take,
as plain values; the command options (one dataclass per command) take their
defaults from them, so a default is written once. Kept free of torch so that
building the CLI stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag
from eaglewire.targets.points import POINTS_HELP
from eaglewire.targets.registry import ENGINES, pinned_version

PROMPTS = "prompts.jsonl"
RESPONSES = "responses.jsonl"
VOCAB_SIZE_HELP = "draft vocab size; 0 = auto (8192, or the full vocab when smaller)"


@dataclass
class GenSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 16
    seed: int = 0
    max_prompt_tokens: int = 1024

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ExtractSettings:
    points: list[str]
    dtype: str = "bf16"
    batch_tokens: int = 4096
    max_seq_len: int = 2048
    shard_samples: int = 256


@dataclass(kw_only=True)
class _RunOptions:
    """Options every data command that runs the target shares."""

    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a hub id (org/name) in the local HF cache")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "model dtype: auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16")
    resume: bool = opt(False, "continue an interrupted run (finished work is not redone)")
    json: bool = json_flag()


@dataclass(kw_only=True)
class _GenOptions:
    prompts: Path | None = opt(None, "prompts: a JSONL, JSON (ShareGPT array) or parquet file of prompts, ShareGPT "
                               "conversations or OpenAI messages; a directory or glob of such files; or a dataset in "
                               "the local HF cache: org/name, or org/name/path-or-glob in it")
    self_prompts: int = opt(0, "number of prompts to sample from the target itself (Magpie-style)", ge=0)
    self_prompt_tokens: int = opt(64, "max tokens of each self-generated prompt", ge=1)
    topic_prompts: int = opt(0, "number of prompts composed from task types x topics (free, diverse)", ge=0)
    max_new_tokens: int = opt(GenSettings.max_new_tokens, "max tokens per regenerated answer", ge=1)
    turns: int = opt(1, "answers per conversation: N > 1 answers each prompt, asks a follow-up question (a fixed "
                     "table, apart from the held-out ones) and lets the target answer again, N answers in all; "
                     "the drafter trains on every answer", ge=1, le=8)
    temperature: float = opt(GenSettings.temperature, "0 = greedy answers", ge=0)
    top_p: float = opt(GenSettings.top_p, "nucleus sampling for answers when temperature > 0", gt=0, le=1)
    # the field keeps its name (code and saved configs use it); the flag is the concept's: --batch-size
    # is the training micro-batch everywhere else
    batch_size: int = opt(GenSettings.batch_size, "generation batch size (left padding)", ge=1,
                          flag="--gen-batch-size", aliases=("--batch-size",))
    seed: int = opt(GenSettings.seed, "random seed (self-prompts and sampled answers)")
    max_prompt_tokens: int = opt(GenSettings.max_prompt_tokens, "prompts longer than this (in tokens, templated) are skipped and counted", ge=1)
    server: str | None = opt(None, "regenerate through this OpenAI-compatible server (vLLM, SGLang, transformers serve, llama.cpp), e.g. http://host:8000/v1; --target then gives only the tokenizer")
    model: str | None = opt(None, "model name to request from --server (default: the first one /v1/models lists)")
    concurrency: int = opt(8, "requests in flight at once with --server", ge=1)
    reasoning: str = opt("keep", "thinking content from --server: keep (train on it, as the target produces it) or strip", choices=("keep", "strip"))
    retries: int = opt(4, "retries per request on 429, 5xx and connection errors (exponential backoff)", ge=0)
    request_timeout: float = opt(600.0, "seconds one server request may take in all (a deadline, not a per-read timeout)", gt=0)


@dataclass(kw_only=True)
class _ExtractOptions:
    points: list[str] = opt(help="capture points (repeat or comma-separate): " + POINTS_HELP, factory=list)
    store_dtype: str = opt(ExtractSettings.dtype, "feature storage dtype: fp32, bf16, fp16", choices=("fp32", "bf16", "fp16"))
    batch_tokens: int = opt(ExtractSettings.batch_tokens, "padded tokens per forward", ge=1)
    max_seq_len: int = opt(ExtractSettings.max_seq_len, "longer conversations are truncated (counted)", ge=2)
    shard_samples: int = opt(ExtractSettings.shard_samples, "samples per shard", ge=1)
    engine: str = opt("transformers", "what runs the target for capture: transformers (in this process) or vllm "
                      "(a vLLM server, tensor/expert parallel: for targets no single device holds)",
                      choices=("transformers", "vllm"))
    engine_url: str | None = opt(None, "with --engine vllm: a capture server you started (the command "
                                 "--print-command prints); default: eaglewire starts and stops one")
    states_dir: Path | None = opt(None, "with --engine vllm (a managed server or --print-command): where the server "
                                  "writes each request's states, a directory this machine reads too (default: "
                                  "<dataset>/.vllm-states); a server at --engine-url says where in each reply")
    tensor_parallel_size: int = opt(1, "with --engine vllm: vLLM --tensor-parallel-size", ge=1)
    engine_args: str = opt("", "with --engine vllm: more vLLM server flags, e.g. '--enable-expert-parallel'")
    vllm_python: str = opt("", "with --engine vllm: Python of a vLLM install; default: `vllm` on PATH, else a "
                           "pinned CPU venv eaglewire builds once")
    startup_timeout: int = opt(1800, "with --engine vllm: seconds to wait for the server to become healthy", ge=10)


@dataclass(kw_only=True)
class DataGenerateConfig(_RunOptions, _GenOptions):
    out: Path = opt(help="dataset directory (created)")


@dataclass(kw_only=True)
class DataExtractConfig(_RunOptions, _ExtractOptions):
    data: Path = opt(help="dataset directory holding responses.jsonl", arg=True)
    request_timeout: float = opt(600.0, "with --engine vllm: seconds one capture request may take in all", gt=0)
    print_command: bool = opt(False, "with --engine vllm: print the capture server's command (to launch it on "
                              "your cluster, then pass --engine-url) and exit")


@dataclass
class DataVocabConfig:
    data: Path = opt(help="dataset directory with finished features", arg=True)
    vocab_size: int = opt(0, VOCAB_SIZE_HELP, ge=0, aliases=("--size",))
    json: bool = json_flag()


@dataclass(kw_only=True)
class DataBuildConfig(_RunOptions, _ExtractOptions, _GenOptions):
    out: Path = opt(help="dataset directory (created)")
    vocab_size: int = opt(0, VOCAB_SIZE_HELP, ge=0)
    gen_capture: bool = opt(True, "keep the features while generating the answers instead of a second forward "
                            "(in process, targets without sliding-window layers; equal to float rounding)")


@dataclass
class DataInfoConfig:
    data: Path = opt(help="dataset directory", arg=True)
    verify: bool = opt(True, "verify shard checksums")
    json: bool = json_flag()


@dataclass
class DataImportConfig:
    src: Path = opt(help="speculators data dir (hidden_states/hs_*.safetensors) or SpecForge output dir (rows_*/data_*.ckpt)", arg=True)
    out: Path = opt(help="eaglewire dataset directory to write (must not exist)")
    format: str = opt("auto", "auto, speculators, specforge")
    points: list[str] = opt(help="physical points the features are (embed, layers.<k>.out, final_norm); default unknown", factory=list)
    layers_from: str = opt("", f"engine meaning of --ids ({', '.join(ENGINES)}; optionally ==VERSION, e.g. "
                                  f"sglang=={pinned_version('sglang')})")
    ids: list[int] = opt(help="layer ids of the features in --layers-from's meaning", factory=list)
    target: str = opt("", "target that produced the states: layer count, fingerprint, final norm for speculators files")
    target_layers: int = opt(0, "the target's layer count when --target is not given (to resolve --ids/--points)")
    all_loss: bool = opt(False, "speculators without pyarrow: train on every token (loss_mask = 1), stated in the manifest")
    shard_samples: int = opt(ExtractSettings.shard_samples, "samples per shard", ge=1)
    json: bool = json_flag()
