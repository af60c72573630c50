"""`eaglewire generate` and `eaglewire bench`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from eaglewire.decoding.shapes import DEFAULTS
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command, opt
from eaglewire.infra.output import emit, json_flag


@dataclass(kw_only=True)
class _DraftShape:
    """How much is drafted per step: `generate` and `bench` take the same options (`_spec_cfg` reads them)."""

    depth: int = opt(DEFAULTS["chain_depth"], "chain: draft tokens per step", ge=1)
    top_k: int = opt(DEFAULTS["top_k"], "tree: frontier size per level", ge=1)
    tree_depth: int = opt(DEFAULTS["tree_depth"], "tree: levels", ge=1)
    total_tokens: int = opt(DEFAULTS["total_tokens"], "tree: tokens per verify (root + drafts)", ge=2)
    min_prob: float | None = opt(None, "chain and tree: drop drafts whose cumulative draft probability is below "
                                 "this; a round where none reaches it verifies the last token alone (0 = keep all; "
                                 "default: 0.1 on CPU, where a wide verify costs more than a decode step, 0 on CUDA)",
                                 ge=0, lt=1)


@dataclass(kw_only=True)
class DecodeConfig(_DraftShape):
    prompt: str = opt(help="the user message (or raw text with --no-chat)")
    target: str = opt("", "target: default, tiny:<arch>, an HF model dir, a .gguf file or a cached hub id; default: the target the "
                      "drafter records, else `default`")
    drafter: Path | None = opt(None, "drafter checkpoint directory; without it decoding is plain")
    mode: str = opt("tree", "plain, chain or tree (chain and tree need a drafter)", choices=("plain", "chain", "tree"))
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
    json: bool = json_flag()


@dataclass(kw_only=True)
class BenchConfig(_DraftShape):
    drafter: Path = opt(help="drafter checkpoint directory (or a training run directory)")
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
                             "context-lookup branch); default: all but hf_prompt_lookup", factory=list)
    chat: bool = opt(True, "apply the target's chat template")
    out: Path | None = opt(None, "directory for bench.json, bench.md, bench.png")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = opt("auto", "auto, fp32, bf16, fp16")
    force: bool = opt(False, "run a drafter that does not match the target (warned)")
    json: bool = json_flag()


def _load(cfg):
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.infra.device import resolve_device, resolve_dtype
    from eaglewire.target.load import load_target

    dev = resolve_device(cfg.device)
    target = load_target(_target_source(cfg), device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    if cfg.drafter is None:
        return target, None, None
    drafter, points, _ = load_drafter_for(target, cfg.drafter, force=cfg.force)
    return target, drafter, points


def _target_source(cfg) -> str:
    """--target, else the drafter's recorded target (loading `default` under another target's drafter
    would only end in a fingerprint refusal), else the embedded default target."""
    if cfg.target:
        return cfg.target
    if cfg.drafter is not None:
        from eaglewire.drafter.checkpoint import read_provenance

        return read_provenance(cfg.drafter).target.source or "default"
    return "default"


def _spec_cfg(cfg, mode: str, device):
    from eaglewire.decoding.engine import SpecConfig

    return SpecConfig(mode=mode, depth=cfg.depth, top_k=cfg.top_k, tree_depth=cfg.tree_depth,
                      total_tokens=cfg.total_tokens, lookup=getattr(cfg, "lookup", 0), min_prob=cfg.min_prob,
                      temperature=getattr(cfg, "temperature", 0.0), top_p=getattr(cfg, "top_p", 1.0),
                      max_new_tokens=cfg.max_new_tokens, stop=list(getattr(cfg, "stop", []) or []),
                      seed=getattr(cfg, "seed", 0)).resolved(device)  # resolved, so outputs record it


def run_generate(cfg: DecodeConfig) -> dict:
    from eaglewire.decoding.engine import SpecEngine

    if not cfg.prompt.strip():
        raise EaglewireError("--prompt is empty (expected some text)")
    target, drafter, points = _load(cfg)
    eng = SpecEngine(target, drafter, points)
    ids = eng.encode(cfg.prompt, chat=cfg.chat)
    spec = _spec_cfg(cfg, cfg.mode if drafter is not None else "plain", target.device)
    res = eng.generate(ids, spec).to_dict()
    res["mode"] = cfg.mode if drafter is not None else "plain"
    res["min_prob"] = spec.min_prob
    emit(res, cfg.json, _print_generated)
    return res


def _print_generated(res: dict) -> None:
    """The text alone on stdout (pipeable); the speed line on stderr."""
    print(res["text"])
    tau = f"tau {res['tau']:.2f}, " if res["tau"] else ""
    print(f"[{res['mode']}: {res['generated_tokens']} tokens, {tau}{res['tokens_per_s']:.1f} tok/s, "
          f"finish: {res['finish_reason']}]", file=sys.stderr)
    gated, rounds = res.get("rounds_without_drafts", 0), res.get("verify_steps", 0)
    if res["mode"] != "plain" and gated:
        print(f"[{gated} of {rounds} rounds had no draft above --min-prob {res.get('min_prob')}: those rounds "
              "decoded one token each]", file=sys.stderr)


def run_bench_cmd(cfg: BenchConfig) -> dict:
    from eaglewire.decoding.bench import markdown

    res = bench_from_config(cfg)
    emit(res, cfg.json, lambda r: print(markdown(r)))
    return res


def heldout_prompts_path() -> Path:
    """The shipped held-out prompt set: hand-written, never used to make training data."""
    return Path(__file__).resolve().parents[1] / "bench_prompts" / "heldout.jsonl"


def _categories(path: Path, n: int) -> list[str]:
    cats = []
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if line.strip():
                obj = json.loads(line)
                cat = obj.get("category", "all") if isinstance(obj, dict) else "all"
                if not isinstance(cat, str):
                    raise EaglewireError(f"{path}:{k}: category {cat!r}: expected a string")
                cats.append(cat)
    return cats[:n] if len(cats) >= n else ["all"] * n


def _round_robin(n: int, cats: list[str]) -> list[int]:
    """Indices of n prompts taking one per category in turn, so a short bench still spans every category."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cats):
        groups.setdefault(c, []).append(i)
    order, k = [], 0
    while len(order) < min(n, len(cats)):
        order += [g[k] for g in groups.values() if k < len(g)][: n - len(order)]
        k += 1
    return sorted(order)


def encode_prompt_file(engine, path: Path, max_prompts: int = 0, chat: bool = True) -> tuple[list[list[int]], list[str]]:
    """(token ids, category) per prompt of a JSONL file; `max_prompts` > 0 takes them round-robin over categories."""
    from eaglewire.data.prompts import load_prompts, prompt_turns

    convs = load_prompts(path)
    cats = _categories(path, len(convs))
    if max_prompts > 0:
        keep = _round_robin(max_prompts, cats)
        convs, cats = [convs[i] for i in keep], [cats[i] for i in keep]
    if not convs:
        raise EaglewireError(f"{path}: no prompts")
    ids = []
    for c in convs:
        turns = prompt_turns(c)
        ids.append(engine.encode(turns if chat else turns[-1]["content"], chat=chat))
    return ids, cats


def bench_from_config(cfg: BenchConfig) -> dict:
    """The benchmark as a function (the demo calls it); writes files when cfg.out is set."""
    from eaglewire.decoding.bench import DEFAULT_METHODS, METHODS, run_bench, write_outputs
    from eaglewire.decoding.engine import SpecEngine

    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise EaglewireError(f"--methods {', '.join(bad)}: expected some of {', '.join(METHODS)}")
    path = cfg.prompts or heldout_prompts_path()
    target, drafter, points = _load(cfg)
    prompts, cats = encode_prompt_file(SpecEngine(target), path, cfg.max_prompts, cfg.chat)
    spec_cfg, shape = _spec_cfg(cfg, "tree", target.device), None
    if cfg.auto_shape and drafter is not None:
        from eaglewire.decoding.bench import auto_shape

        shape = auto_shape(target, drafter, points, prompts[: cfg.auto_shape], cfg.max_new_tokens, spec_cfg)
        b = shape["best"]
        spec_cfg.top_k, spec_cfg.tree_depth, spec_cfg.total_tokens = b["top_k"], b["tree_depth"], b["total_tokens"]
        spec_cfg.min_prob = b["min_prob"]
    res = run_bench(target, drafter, points, prompts, cfg.max_new_tokens, spec_cfg,
                    methods=tuple(cfg.methods) or DEFAULT_METHODS, categories=cats, repeats=cfg.repeats)
    if shape is not None:
        res["auto_shape"] = shape
    res["prompts"] = str(path)
    if cfg.out is not None:
        res["files"] = write_outputs(res, cfg.out)
    return res


def register(app: typer.Typer) -> None:
    build_command(app, "generate", DecodeConfig, run_generate,
                  "Generate with speculative decoding (plain decoding without --drafter).")
    build_command(app, "bench", BenchConfig, run_bench_cmd,
                  "Compare transformers generate, prompt lookup, plain, chain and tree decoding.")
