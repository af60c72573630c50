"""Generation and the benchmark as functions over their configs: the commands and the demo call them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.prompt_files import load_prompts
from eaglewire.data.prompts import prompt_turns
from eaglewire.decoding.bench import (
    DEFAULT_METHODS,
    DFLASH_METHODS,
    EAGLE3_METHODS,
    METHODS,
    PEAGLE_METHODS,
    auto_shape,
    run_bench,
    write_outputs,
)
from eaglewire.decoding.compat import drafter_mismatches, load_drafter_for, refuse_unless_forced
from eaglewire.decoding.config import BenchConfig
from eaglewire.decoding.dflash import BlockEngine, block_stats
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.device import resolve_device, resolve_dtype
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import read_provenance
from eaglewire.saved.dflash import is_dflash_checkpoint, load_dflash_checkpoint
from eaglewire.targets.load import load_target

# options that shape EAGLE-3 drafts (trees, gates, lookup, the drafter's weight format); a DFlash drafter drafts
# one block of --depth tokens per round and a P-EAGLE one --depth parallel drafts: neither has any of them
EAGLE3_ONLY = ("top_k", "tree_depth", "total_tokens", "min_prob", "gate", "draft_weights", "lookup", "auto_shape")


def load_models(cfg):
    """(target, drafter or None, capture points or None); the drafter is an EAGLE-3 or a DFlash one."""
    dev = resolve_device(cfg.device)
    target = load_target(target_source(cfg), device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    if cfg.drafter is None:
        return target, None, None
    if is_dflash_checkpoint(cfg.drafter):
        drafter = load_dflash_for(target, cfg.drafter, force=cfg.force)
        return target, drafter, drafter.config.points
    drafter, points, _ = load_drafter_for(target, cfg.drafter, force=cfg.force)
    return target, drafter, points


def load_dflash_for(target, path: Path, force: bool = False) -> DFlashDrafter:
    """A DFlash checkpoint on the target's device/dtype; mismatches refused unless ``force`` (compat.py's rule)."""
    drafter, prov = load_dflash_checkpoint(Path(path), device=target.device, dtype=target.dtype)
    c, wiring = drafter.config, []  # what no --force can run
    if c.hidden_size != target.hidden_size:
        wiring.append(f"hidden size: drafter expects {c.hidden_size}, target has {target.hidden_size}")
    if c.vocab_size != target.vocab_size:
        wiring.append(f"vocab: drafter has {c.vocab_size}, target has {target.vocab_size}")
    if max(c.target_layer_ids) >= target.num_layers:
        wiring.append(f"target_layer_ids {list(c.target_layer_ids)} (z-lab id k = layers.k.out): the target has "
                      f"{target.num_layers} layers")
    if wiring:
        raise EaglewireError(f"DFlash drafter {path} cannot be wired to target {target.source!r}: " + "; ".join(wiring))
    refuse_unless_forced(target, path, drafter_mismatches(target, prov), force, "DFlash drafter")
    return drafter


def refuse_eagle3_only(cfg, kind: str) -> None:
    """One line for the EAGLE-3 draft-shape options given with a drafter that drafts K tokens in one forward."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    given = [f"--{n.replace('_', '-')}" for n in EAGLE3_ONLY if n in fields and getattr(cfg, n) != fields[n].default]
    if given:
        raise EaglewireError(f"{', '.join(given)}: EAGLE-3 draft-shape option(s); a {kind} ({cfg.drafter}) drafts "
                             f"--depth tokens in one forward per round: drop them")


def dflash_depth(cfg, drafter: DFlashDrafter) -> int:
    """Drafts per round for a DFlash drafter: --depth as given (at most block_size - 1, else one line), and
    when left at its default, the default capped at block_size - 1. Refuses the EAGLE-3 draft-shape options."""
    refuse_eagle3_only(cfg, "DFlash drafter")
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    most = drafter.config.block_size - 1
    if cfg.depth == fields["depth"].default:
        return min(cfg.depth, most)
    if cfg.depth > most:
        raise EaglewireError(f"--depth {cfg.depth}: the DFlash drafter {cfg.drafter} has block_size {most + 1}, "
                             f"so it drafts 1..{most} tokens per round (block_size - 1)")
    return cfg.depth


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
    dflash, peagle = isinstance(drafter, DFlashDrafter), isinstance(drafter, PEagleDrafter)
    if peagle:
        refuse_eagle3_only(cfg, "P-EAGLE drafter")
    depth = dflash_depth(cfg, drafter) if dflash else cfg.depth
    kind = "a DFlash one" if dflash else "a P-EAGLE one" if peagle else "an EAGLE-3 one" if drafter is not None else "none"
    need = {**dict.fromkeys(EAGLE3_METHODS, "an EAGLE-3 drafter"), "eaglewire_dflash": "a DFlash drafter",
            "eaglewire_peagle": "a P-EAGLE drafter"}
    wrong = [m for m in cfg.methods if m in need and need[m] != (kind.replace("one", "drafter") if drafter else None)]
    if wrong:
        raise EaglewireError(f"--methods {', '.join(wrong)}: needs {need[wrong[0]]}; {cfg.drafter} is {kind}")
    prompts, cats = encode_prompt_file(SpecEngine(target), path, cfg.max_prompts, cfg.chat)
    spec_cfg, shape = dataclasses.replace(spec_config(cfg, "tree", target.device), depth=depth), None
    if cfg.auto_shape and drafter is not None:
        shape = auto_shape(target, drafter, points, prompts[: cfg.auto_shape], cfg.max_new_tokens, spec_cfg,
                           draft_weights=cfg.draft_weights)
        b = shape["best"]
        spec_cfg.top_k, spec_cfg.tree_depth, spec_cfg.total_tokens = b["top_k"], b["tree_depth"], b["total_tokens"]
        spec_cfg.min_prob = b["min_prob"]
    res = run_bench(target, drafter, points, prompts, cfg.max_new_tokens, spec_cfg,
                    methods=tuple(cfg.methods) or (DFLASH_METHODS if dflash else PEAGLE_METHODS if peagle
                                                   else DEFAULT_METHODS),
                    categories=cats, repeats=cfg.repeats,
                    draft_weights=cfg.draft_weights)
    if shape is not None:
        res["auto_shape"] = shape
    res["prompts"] = str(path)
    if cfg.out is not None:
        res["files"] = write_outputs(res, cfg.out)
    return res


def generate_dflash(cfg, target, drafter: DFlashDrafter) -> dict:
    """`generate` with a DFlash drafter: block decoding (``--mode plain``: plain), greedy or sampled.

    ``--vs-plain`` decodes the same prompt plainly right after (both engines warmed up first, as bench
    does) and reports ``speedup_vs_plain`` and, greedy, whether the tokens match."""
    depth = dflash_depth(cfg, drafter)  # refusals before any decoding
    eng, plain = BlockEngine(target, drafter), SpecEngine(target)
    ids = eng.encode(cfg.prompt, chat=cfg.chat)
    spec = dataclasses.replace(spec_config(cfg, "chain", target.device), depth=depth, min_prob=None)
    if cfg.mode == "plain":
        res = plain.generate(ids, dataclasses.replace(spec, mode="plain")).to_dict()
        return {**res, "mode": "plain"}
    if cfg.vs_plain:
        for e, mode in ((eng, "chain"), (plain, "plain")):
            e.generate(ids, dataclasses.replace(spec, mode=mode, max_new_tokens=min(8, spec.max_new_tokens)))
    r = eng.generate(ids, spec)
    res = {**r.to_dict(), "mode": "dflash", "depth": depth, "block_size": drafter.config.block_size,
           **block_stats(r.metrics)}
    if cfg.vs_plain:
        p = plain.generate(ids, dataclasses.replace(spec, mode="plain"))
        res["plain_tokens_per_s"] = p.metrics.to_dict()["tokens_per_s"]
        res["speedup_vs_plain"] = res["tokens_per_s"] / res["plain_tokens_per_s"]
        if spec.temperature == 0:
            res["matches_plain"] = p.token_ids == r.token_ids
    return res


def generate_peagle(cfg, target, drafter: PEagleDrafter, points) -> dict:
    """`generate` with a P-EAGLE drafter: --depth parallel drafts per round, greedy or sampled (``--mode plain``: plain);
    the rounds counted as vLLM counts them (``block_stats``)."""
    refuse_eagle3_only(cfg, "P-EAGLE drafter")  # refusals before any decoding
    eng = ParallelEngine(target, drafter, points)
    ids = eng.encode(cfg.prompt, chat=cfg.chat)
    spec = dataclasses.replace(spec_config(cfg, "chain", target.device), min_prob=None)
    if cfg.mode == "plain":
        return {**SpecEngine(target).generate(ids, dataclasses.replace(spec, mode="plain")).to_dict(), "mode": "plain"}
    r = eng.generate(ids, spec)
    return {**r.to_dict(), "mode": "p-eagle", "depth": spec.depth, **block_stats(r.metrics)}
