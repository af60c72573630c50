"""The options of `eaglewire generate` and `eaglewire bench`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.decoding.shapes import DEFAULTS
from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag


@dataclass(kw_only=True)
class _DraftShape:
    """How much is drafted per step: `generate` and `bench` take the same options (`decoding.run.spec_config` reads them)."""

    depth: int = opt(DEFAULTS["chain_depth"], "chain, and DFlash blocks: draft tokens per round (vLLM's "
                     "num_speculative_tokens); DFlash: at most block_size - 1, the default capped there", ge=1)
    top_k: int = opt(DEFAULTS["top_k"], "tree: frontier size per level", ge=1)
    tree_depth: int = opt(DEFAULTS["tree_depth"], "tree: levels", ge=1)
    total_tokens: int = opt(DEFAULTS["total_tokens"], "tree: tokens per verify (root + drafts)", ge=2)
    min_prob: float | None = opt(None, "chain and tree: drop drafts whose cumulative draft probability is below "
                                 "this; a round where none reaches it verifies the last token alone (0 = keep all; "
                                 "default: 0.1 on CPU, where a wide verify costs more than a decode step, 0 on CUDA)",
                                 ge=0, lt=1)
    gate: str = opt("path", "chain: what --min-prob compares: path (the draft probability of the whole chain so "
                    "far) or step (each step's best draft probability among its 10 best, llama.cpp's "
                    "--spec-draft-p-min rule)", choices=("path", "step"))
    draft_weights: str = opt("int8", "the drafter's weight matrices while drafting on CPU: bf16 (half the bytes each "
                             "draft step streams; drafts may differ from fp32's at near-ties, outputs stay exact), "
                             "int8 (a quarter: each row as int8 with one scale) or fp32 (the drafter as trained); "
                             "elsewhere the drafter runs as loaded", choices=("fp32", "bf16", "int8"))


@dataclass(kw_only=True)
class DecodeConfig(_DraftShape):
    prompt: str = opt(help="the user message (or raw text with --no-chat)")
    target: str = opt("", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a cached hub id; default: the target the "
                      "drafter records, else `default`")
    drafter: Path | None = opt(None, "drafter checkpoint directory (EAGLE-3 or DFlash); without it decoding is plain")
    mode: str = opt("tree", "plain, chain or tree (chain and tree need a drafter; with a DFlash drafter both decode "
                    "one block of --depth drafts per round)", choices=("plain", "chain", "tree"))
    temperature: float = opt(0.0, "0 = greedy (exactly the target's greedy output)", ge=0)
    top_p: float = opt(1.0, "nucleus sampling when temperature > 0", gt=0, le=1)
    max_new_tokens: int = opt(128, "max generated tokens", ge=1)
    stop: list[str] = opt(help="stop string (repeatable); removed from the output", factory=list)
    chat: bool = opt(True, "apply the target's chat template")
    lookup: int = opt(0, "tree, greedy: also verify up to N tokens copied from the context (prompt lookup)", ge=0)
    seed: int = opt(0, "sampling seed")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16")
    force: bool = opt(False, "run a drafter that does not match the target (warned)")
    vs_plain: bool = opt(False, "DFlash: also decode the prompt plainly right after (both warmed up) and report "
                         "speedup_vs_plain, and for greedy whether the tokens match")
    json: bool = json_flag()


@dataclass(kw_only=True)
class BenchConfig(_DraftShape):
    drafter: Path = opt(help="drafter checkpoint directory, EAGLE-3 or DFlash (or a training run directory)")
    prompts: Path | None = opt(None, 'JSONL: {"prompt": ..., "category": ...} or {"messages": [...]} per line; '
                               "default: the shipped held-out set (54 prompts, 9 categories)")
    target: str = opt("", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a cached hub id; default: the target the "
                      "drafter records, else `default`")
    max_new_tokens: int = opt(64, "max generated tokens per prompt (every method)", ge=1)
    max_prompts: int = opt(0, "use only N prompts (0 = all), taken round-robin over the categories", ge=0)
    repeats: int = opt(1, "timed passes over the prompts (ratios per pass -> median and range)", ge=1)
    auto_shape: int = opt(0, "first try several tree shapes on this many prompts and bench the fastest (0 = off)", ge=0)
    methods: list[str] = opt(help="methods (repeatable): hf_generate, eaglewire_plain, hf_prompt_lookup, "
                             "eaglewire_chain, eaglewire_tree, eaglewire_tree_lookup (the drafter's tree plus a "
                             "context-lookup branch), eaglewire_dflash (a DFlash drafter's blocks); default: all "
                             "but hf_prompt_lookup that the drafter can run", factory=list)
    chat: bool = opt(True, "apply the target's chat template")
    out: Path | None = opt(None, "directory for bench.json, bench.md, bench.png")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "auto, fp32, bf16, fp16")
    force: bool = opt(False, "run a drafter that does not match the target (warned)")
    json: bool = json_flag()
