"""`eaglewire generate` and `eaglewire bench`."""

from __future__ import annotations

import sys

import typer

from eaglewire.decoding.config import BenchConfig, DecodeConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit


def run_generate(cfg: DecodeConfig) -> dict:
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.decoding.run import (
        DFlashDrafter,
        PEagleDrafter,
        generate_dflash,
        generate_peagle,
        load_models,
        spec_config,
    )
    from eaglewire.saved.dflash import is_dflash_checkpoint

    if not cfg.prompt.strip():
        raise EaglewireError("--prompt is empty (expected some text)")
    if cfg.vs_plain and (cfg.drafter is None or not is_dflash_checkpoint(cfg.drafter)):
        raise EaglewireError("--vs-plain: DFlash drafters only (EAGLE-3 drafters compare with `eaglewire bench`)")
    target, drafter, points = load_models(cfg)
    if isinstance(drafter, DFlashDrafter | PEagleDrafter):  # K drafts from one drafter forward per round
        res = generate_dflash(cfg, target, drafter) if isinstance(drafter, DFlashDrafter) else \
            generate_peagle(cfg, target, drafter, points)
        emit(res, cfg.json, _print_generated)
        return res
    eng = SpecEngine(target, drafter, points, draft_weights=cfg.draft_weights)
    ids = eng.encode(cfg.prompt, chat=cfg.chat)
    spec = spec_config(cfg, cfg.mode if drafter is not None else "plain", target.device)
    res = eng.generate(ids, spec).to_dict()
    res["mode"] = cfg.mode if drafter is not None else "plain"
    res["min_prob"] = spec.min_prob
    emit(res, cfg.json, _print_generated)
    return res


def _print_generated(res: dict) -> None:
    """The text alone on stdout (pipeable); the speed line on stderr."""
    print(res["text"])
    tau = f"tau {res['tau']:.2f}, " if res["tau"] else ""
    vs = f", {res['speedup_vs_plain']:.2f}x plain" if res.get("speedup_vs_plain") else ""
    print(f"[{res['mode']}: {res['generated_tokens']} tokens, {tau}{res['tokens_per_s']:.1f} tok/s{vs}, "
          f"finish: {res['finish_reason']}]", file=sys.stderr)
    gated, rounds = res.get("rounds_without_drafts", 0), res.get("verify_steps", 0)
    if res["mode"] != "plain" and gated:
        print(f"[{gated} of {rounds} rounds had no draft above --min-prob {res.get('min_prob')}: those rounds "
              "decoded one token each]", file=sys.stderr)


def run_bench_cmd(cfg: BenchConfig) -> dict:
    from eaglewire.decoding.bench import markdown
    from eaglewire.decoding.run import bench_from_config

    res = bench_from_config(cfg)
    emit(res, cfg.json, lambda r: print(markdown(r)))
    return res


def register(app: typer.Typer) -> None:
    build_command(app, "generate", DecodeConfig, run_generate,
                  "Generate with speculative decoding (plain decoding without --drafter).")
    build_command(app, "bench", BenchConfig, run_bench_cmd,
                  "Compare transformers generate, prompt lookup, plain, chain, tree, DFlash and P-EAGLE decoding.")
