"""Generation and the benchmark as functions over their configs: the commands and the demo call them."""

from __future__ import annotations

import json
from pathlib import Path

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.prompt_files import load_prompts
from eaglewire.data.prompts import prompt_turns
from eaglewire.decoding.bench import DEFAULT_METHODS, METHODS, auto_shape, run_bench, write_outputs
from eaglewire.decoding.compat import load_drafter_for
from eaglewire.decoding.config import BenchConfig
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.infra.device import resolve_device, resolve_dtype
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import read_provenance
from eaglewire.targets.load import load_target


def load_models(cfg):
    dev = resolve_device(cfg.device)
    target = load_target(target_source(cfg), device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    if cfg.drafter is None:
        return target, None, None
    drafter, points, _ = load_drafter_for(target, cfg.drafter, force=cfg.force)
    return target, drafter, points


def target_source(cfg) -> str:
    """--target, else the drafter's recorded target (loading `default` under another target's drafter
    would only end in a fingerprint refusal), else the embedded default target."""
    if cfg.target:
        return cfg.target
    if cfg.drafter is not None:
        return read_provenance(cfg.drafter).target.source or "default"
    return "default"


def spec_config(cfg, mode: str, device):
    return SpecConfig(mode=mode, depth=cfg.depth, top_k=cfg.top_k, tree_depth=cfg.tree_depth,
                      total_tokens=cfg.total_tokens, lookup=getattr(cfg, "lookup", 0), min_prob=cfg.min_prob,
                      gate=getattr(cfg, "gate", "path"), temperature=getattr(cfg, "temperature", 0.0), top_p=getattr(cfg, "top_p", 1.0),
                      max_new_tokens=cfg.max_new_tokens, stop=list(getattr(cfg, "stop", []) or []),
                      seed=getattr(cfg, "seed", 0)).resolved(device)  # resolved, so outputs record it


def prompt_categories(path: Path, n: int) -> list[str]:
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


def round_robin(n: int, cats: list[str]) -> list[int]:
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
    convs = load_prompts(path)
    cats = prompt_categories(path, len(convs))
    if max_prompts > 0:
        keep = round_robin(max_prompts, cats)
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
    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise EaglewireError(f"--methods {', '.join(bad)}: expected some of {', '.join(METHODS)}")
    path = cfg.prompts or heldout_prompts_path()
    target, drafter, points = load_models(cfg)
    prompts, cats = encode_prompt_file(SpecEngine(target), path, cfg.max_prompts, cfg.chat)
    spec_cfg, shape = spec_config(cfg, "tree", target.device), None
    if cfg.auto_shape and drafter is not None:
        shape = auto_shape(target, drafter, points, prompts[: cfg.auto_shape], cfg.max_new_tokens, spec_cfg,
                           draft_weights=cfg.draft_weights)
        b = shape["best"]
        spec_cfg.top_k, spec_cfg.tree_depth, spec_cfg.total_tokens = b["top_k"], b["tree_depth"], b["total_tokens"]
        spec_cfg.min_prob = b["min_prob"]
    res = run_bench(target, drafter, points, prompts, cfg.max_new_tokens, spec_cfg,
                    methods=tuple(cfg.methods) or DEFAULT_METHODS, categories=cats, repeats=cfg.repeats,
                    draft_weights=cfg.draft_weights)
    if shape is not None:
        res["auto_shape"] = shape
    res["prompts"] = str(path)
    if cfg.out is not None:
        res["files"] = write_outputs(res, cfg.out)
    return res
