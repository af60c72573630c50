"""EAGLE-3, DFlash and P-EAGLE side by side: the same data, the same training budget, the same held-out prompts.

Train the three from one dataset (the quick preset's: `eaglewire demo --print-commands` shows its data build)
with the quick preset's budget (2 epochs, batch 2, max length 512), then:

    eaglewire train --data D --out R/eagle3 --epochs 2 --batch-size 2 --lr 0.003 --ttt-steps 3 --lk-weight 1 \\
        --max-len 512 --init target --freeze-head
    eaglewire train --data D --out R/dflash --drafter dflash --epochs 2 --batch-size 2 --max-len 512 --lr 0.0006
    eaglewire train --data D --out R/peagle --drafter p-eagle --epochs 2 --batch-size 2 --lr 0.003 --max-len 512 \\
        --init target --freeze-head
    python benchmarks/bench_parallel.py --heldout H --drafter eagle3=R/eagle3 --drafter dflash=R/dflash \\
        --drafter p-eagle=R/peagle --json R/parallel.json

Figures, all at 3 drafts per round (the one default depth; DFlash block 4):
- held-out mean acceptance length as vLLM counts it (1 + accepted per round) with its 95% interval
  (answers resampled) and per position, replayed offline along the target's greedy answers to the shipped
  held-out prompts (H: `eaglewire data build --prompts src/eaglewire/bench_prompts/heldout.jsonl --points
  eagle3-deep`): EAGLE-3 by `decoding.acceptance.chain_stats`, DFlash by `decoding.block_acceptance`, which
  equal online decoding round for round; a drafter kind without an offline walk is decoded online;
- in eaglewire's engine, on --num-prompts held-out prompts, each drafter and plain decoding interleaved per
  prompt: tokens/s, speedup against our own plain decoding, draft and verify milliseconds per round.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.acceptance import bootstrap_interval, chain_stats
from eaglewire.decoding.block_acceptance import block_chain_stats
from eaglewire.decoding.dflash import BlockEngine
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.saved.checkpoint import load_checkpoint, read_provenance, resolve_dir
from eaglewire.saved.dflash import is_dflash_checkpoint, load_dflash_checkpoint
from eaglewire.targets.load import load_target

DEPTH = 3


def _engine(target, ckpt: Path):
    """(kind, engine, drafter) for a checkpoint: block decoding for DFlash, the chain (or its parallel form) else."""
    if is_dflash_checkpoint(ckpt):
        drafter, _ = load_dflash_checkpoint(ckpt, device=target.device, dtype=target.dtype)
        return "dflash", BlockEngine(target, drafter), drafter
    drafter, prov = load_checkpoint(ckpt, device=target.device, dtype=target.dtype)
    if isinstance(drafter, PEagleDrafter):
        return "p-eagle", ParallelEngine(target, drafter, prov.points), drafter
    return "eagle3", SpecEngine(target, drafter, prov.points), drafter


def offline(kind: str, drafter, heldout: Path, target, n: int) -> dict | None:
    """The held-out figures replayed along stored answers (None: no offline walk for this kind)."""
    ds = FeatureDataset(heldout, verify=False)
    head_w = target.model.get_output_embeddings().weight.detach().float()
    if kind == "dflash":
        embed_w = target.model.get_input_embeddings().weight.detach().float()
        return block_chain_stats(drafter, ds, embed_w, head_w, n, DEPTH)
    if kind == "eagle3":
        return chain_stats(drafter.float().eval(), ds, head_w, n, DEPTH)
    return None


def online(engines: dict, prompts: list[list[int]], max_new: int) -> dict:
    """Each engine and plain decoding on every prompt, interleaved (one machine state for all), greedy."""
    cfg = {k: SpecConfig(mode="plain" if k == "plain" else "chain", depth=DEPTH, max_new_tokens=max_new)
           for k in engines}
    for name, eng in engines.items():  # warm up kernels and caches
        eng.generate(prompts[0], cfg[name])
    out = {k: {"tokens": 0, "seconds": 0.0, "rounds": [], "draft_s": 0.0, "verify_s": 0.0, "same_as_plain": True}
           for k in engines}
    for p in prompts:
        ref = None
        for name, eng in engines.items():
            t0 = time.perf_counter()
            r = eng.generate(p, cfg[name])
            dt = time.perf_counter() - t0
            o = out[name]
            o["tokens"] += len(r.token_ids)
            o["seconds"] += dt
            o["rounds"].append([s.accepted for s in r.metrics.steps if s.drafted])
            o["draft_s"] += r.metrics.time.get("draft", 0.0)
            o["verify_s"] += r.metrics.time.get("verify", 0.0)
            ref = r.token_ids if name == "plain" else ref
            o["same_as_plain"] &= ref is None or r.token_ids == ref
    plain_tps = out["plain"]["tokens"] / out["plain"]["seconds"]
    res = {}
    for name, o in out.items():
        flat = [a for per in o["rounds"] for a in per]
        n_r = max(len(flat), 1)
        res[name] = {"tokens_per_s": o["tokens"] / o["seconds"], "speedup_vs_plain": o["tokens"] / o["seconds"] / plain_tps,
                     "lossless": o["same_as_plain"]}
        if name != "plain":
            res[name].update(rounds=len(flat), mean_acceptance_length=1 + sum(flat) / n_r,
                             mean_acceptance_length_ci95=bootstrap_interval(o["rounds"]),
                             acceptance_rate_per_position=[sum(a > k for a in flat) / n_r for k in range(DEPTH)],
                             draft_ms_per_round=1000 * o["draft_s"] / n_r, verify_ms_per_round=1000 * o["verify_s"] / n_r)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", action="append", required=True, help="NAME=checkpoint or run dir (repeat)")
    ap.add_argument("--heldout", type=Path, required=True, help="dataset of the held-out prompts' greedy answers")
    ap.add_argument("--target", default="", help="default: the one the first drafter records")
    ap.add_argument("--heldout-samples", type=int, default=54)
    ap.add_argument("--num-prompts", type=int, default=9)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    named = dict(d.split("=", 1) for d in a.drafter)
    ckpts = {k: resolve_dir(Path(v)) for k, v in named.items()}
    target = load_target(a.target or read_provenance(next(iter(ckpts.values()))).target.source)
    engines, results = {"plain": SpecEngine(target)}, {}
    for name, ckpt in ckpts.items():
        kind, eng, drafter = _engine(target, ckpt)
        engines[name] = eng
        t0 = time.perf_counter()
        off = offline(kind, drafter, a.heldout, target, a.heldout_samples)
        results[name] = {"kind": kind, "checkpoint": str(ckpt), "heldout_seconds": time.perf_counter() - t0,
                         "heldout": None if off is None else {k: off[k] for k in (
                             "mean_acceptance_length", "mean_acceptance_length_ci95", "acceptance_rate_per_position",
                             "rounds", "samples") if k in off}}
    prompts = encode_prompt_file(engines["plain"], heldout_prompts_path(), a.num_prompts)[0]
    live = online(engines, prompts, a.max_new_tokens)
    for name in results:
        results[name]["engine"] = live[name]
    report = {"depth": DEPTH, "target": target.source, "threads": torch.get_num_threads(), "num_prompts": len(prompts),
              "max_new_tokens": a.max_new_tokens, "plain_tokens_per_s": live["plain"]["tokens_per_s"], "drafters": results}
    print("| drafter | held-out acceptance (95%) | per position | our engine: speedup | draft ms/round | lossless |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        h, e = r["heldout"] or e_held(r), r["engine"]
        ci = h.get("mean_acceptance_length_ci95") or [float("nan")] * 2
        print(f"| {name} ({r['kind']}) | {h['mean_acceptance_length']:.3f} ({ci[0]:.3f}-{ci[1]:.3f}) | "
              f"{' / '.join(f'{x:.2f}' for x in h['acceptance_rate_per_position'])} | {e['speedup_vs_plain']:.2f}x | "
              f"{e['draft_ms_per_round']:.1f} | {e['lossless']} |")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))


def e_held(r: dict) -> dict:
    """Online figures stand in where a kind has no offline walk (marked as such in the JSON)."""
    r["heldout_from"] = "online decoding of --num-prompts prompts"
    return r["engine"]


if __name__ == "__main__":
    main()
