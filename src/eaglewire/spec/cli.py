"""`eaglewire generate` and `eaglewire bench`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from ..config import build_command, opt
from ..errors import EaglewireError
from .engine import DEFAULTS


@dataclass
class GenerateConfig:
    prompt: str = opt(help="the user message (or raw text with --no-chat)")
    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir or a .gguf file")
    drafter: Path | None = opt(None, "drafter checkpoint directory; without it decoding is plain")
    mode: str = opt("tree", "chain or tree (with a drafter)")
    temperature: float = opt(0.0, "0 = greedy (exactly the target's greedy output)")
    top_p: float = opt(1.0, "nucleus sampling when temperature > 0")
    max_new_tokens: int = opt(128, "max generated tokens")
    stop: list[str] = opt(help="stop string (repeatable); removed from the output", factory=list)
    chat: bool = opt(True, "apply the target's chat template")
    depth: int = opt(DEFAULTS["chain_depth"], "chain: draft tokens per step")
    top_k: int = opt(DEFAULTS["top_k"], "tree: frontier size per level")
    tree_depth: int = opt(DEFAULTS["tree_depth"], "tree: levels")
    total_tokens: int = opt(DEFAULTS["total_tokens"], "tree: tokens per verify (root + drafts)")
    seed: int = opt(0, "sampling seed")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "auto (bf16 on CUDA, fp32 on CPU), fp32, bf16, fp16")
    force: bool = opt(False, "run a drafter that does not match the target (warned)")
    json: bool = opt(False, "print JSON")


@dataclass
class BenchConfig:
    drafter: Path = opt(help="drafter checkpoint directory")
    prompts: Path = opt(help='JSONL: {"prompt": ...} or {"messages": [...]} per line')
    target: str = opt("default", "target: default, tiny:<arch>, an HF model dir or a .gguf file")
    max_new_tokens: int = opt(64, "max generated tokens per prompt (every method)")
    max_prompts: int = opt(0, "use only the first N prompts (0 = all)")
    depth: int = opt(DEFAULTS["chain_depth"], "chain: draft tokens per step")
    top_k: int = opt(DEFAULTS["top_k"], "tree: frontier size per level")
    tree_depth: int = opt(DEFAULTS["tree_depth"], "tree: levels")
    total_tokens: int = opt(DEFAULTS["total_tokens"], "tree: tokens per verify (root + drafts)")
    chat: bool = opt(True, "apply the target's chat template")
    out: Path | None = opt(None, "directory for bench.json, bench.md, bench.png")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "auto, fp32, bf16, fp16")
    force: bool = opt(False, "run a drafter that does not match the target (warned)")
    json: bool = opt(False, "print JSON")


def _load(cfg):
    from ..device import resolve_device, resolve_dtype
    from ..targets import load_target
    from .compat import load_drafter_for

    dev = resolve_device(cfg.device)
    target = load_target(cfg.target, device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    if cfg.drafter is None:
        return target, None, None
    drafter, points, _ = load_drafter_for(target, cfg.drafter, force=cfg.force)
    return target, drafter, points


def _spec_cfg(cfg, mode: str):
    from .engine import SpecConfig

    return SpecConfig(mode=mode, depth=cfg.depth, top_k=cfg.top_k, tree_depth=cfg.tree_depth,
                      total_tokens=cfg.total_tokens,
                      temperature=getattr(cfg, "temperature", 0.0), top_p=getattr(cfg, "top_p", 1.0),
                      max_new_tokens=cfg.max_new_tokens, stop=list(getattr(cfg, "stop", []) or []),
                      seed=getattr(cfg, "seed", 0))


def run_generate(cfg: GenerateConfig) -> dict:
    from .engine import SpecEngine

    if not cfg.prompt.strip():
        raise EaglewireError("--prompt is empty (expected some text)")
    target, drafter, points = _load(cfg)
    eng = SpecEngine(target, drafter, points)
    ids = eng.encode(cfg.prompt, chat=cfg.chat)
    res = eng.generate(ids, _spec_cfg(cfg, cfg.mode if drafter is not None else "plain")).to_dict()
    res["mode"] = cfg.mode if drafter is not None else "plain"
    if cfg.json:
        print(json.dumps(res, indent=2))
    else:
        print(res["text"])
        tau = f"tau {res['tau']:.2f}, " if res["tau"] else ""
        print(f"[{res['mode']}: {res['generated_tokens']} tokens, {tau}{res['tokens_per_s']:.1f} tok/s, "
              f"finish: {res['finish_reason']}]", file=sys.stderr)
    return res


def run_bench_cmd(cfg: BenchConfig) -> dict:
    from .bench import markdown

    res = bench_from_config(cfg)
    print(json.dumps(res, indent=2) if cfg.json else markdown(res))
    return res


def bench_from_config(cfg: BenchConfig) -> dict:
    """The benchmark as a function (the demo calls it); writes files when cfg.out is set."""
    from ..data.prompts import load_prompts, prompt_turns
    from .bench import run_bench, write_outputs
    from .engine import SpecEngine

    convs = load_prompts(cfg.prompts)
    if cfg.max_prompts > 0:
        convs = convs[: cfg.max_prompts]
    if not convs:
        raise EaglewireError(f"{cfg.prompts}: no prompts")
    target, drafter, points = _load(cfg)
    enc = SpecEngine(target)
    prompts = []
    for c in convs:
        turns = prompt_turns(c)
        prompts.append(enc.encode(turns if cfg.chat else turns[-1]["content"], chat=cfg.chat))
    res = run_bench(target, drafter, points, prompts, cfg.max_new_tokens, _spec_cfg(cfg, "tree"))
    if cfg.out is not None:
        res["files"] = write_outputs(res, cfg.out)
    return res


def register(app: typer.Typer) -> None:
    build_command(app, "generate", GenerateConfig, run_generate,
                  "Generate with speculative decoding (plain decoding without --drafter).")
    build_command(app, "bench", BenchConfig, run_bench_cmd,
                  "Compare transformers generate, prompt lookup, plain, chain and tree decoding.")
