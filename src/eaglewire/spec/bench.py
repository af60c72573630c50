"""Side-by-side benchmark: the same prompts and token budget for every method.

Methods: transformers ``generate`` greedy (the baseline), eaglewire plain
decoding, transformers prompt-lookup decoding, eaglewire chain and tree.
Every method is run once on a short warm-up first (first-call allocations
and oneDNN weight packing are not what a server pays per request). Greedy
outputs of every method are compared token-for-token with the baseline; the
count of prompts that differ is reported, since a speedup that changes the
output is not a speedup.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .engine import SpecConfig, SpecEngine
from .metrics import Metrics

METHODS = ("hf_generate", "eaglewire_plain", "hf_prompt_lookup", "eaglewire_chain", "eaglewire_tree")


def _hf(target, ids: list[int], max_new: int, lookup: int | None) -> list[int]:
    x = torch.tensor([ids], device=target.device)
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.inference_mode():
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                    max_new_tokens=max_new, eos_token_id=target.eos_ids(),
                                    pad_token_id=target.eos_ids()[0], **kw)
    return out[0, x.shape[1]:].tolist()


def _run_method(method: str, target, engines: dict, prompts: list[list[int]], max_new: int, cfg: SpecConfig):
    """(outputs per prompt, seconds, aggregated Metrics or None)."""
    outs, agg, total = [], Metrics(), 0.0
    for ids in prompts:
        t0 = time.perf_counter()
        if method.startswith("hf_"):
            outs.append(_hf(target, ids, max_new, 10 if method == "hf_prompt_lookup" else None))
            total += time.perf_counter() - t0
            continue
        mode = method.split("_", 1)[1]
        eng = engines["plain" if mode == "plain" else "spec"]
        r = eng.generate(ids, SpecConfig(**{**cfg.__dict__, "mode": mode, "max_new_tokens": max_new, "temperature": 0.0}))
        total += time.perf_counter() - t0
        outs.append(r.token_ids)
        agg.add(r.metrics)
    return outs, total, (agg if not method.startswith("hf_") else None)


def run_bench(target, drafter, points, prompts: list[list[int]], max_new: int,
              cfg: SpecConfig | None = None, methods=METHODS) -> dict:
    cfg = cfg or SpecConfig()
    engines = {"plain": SpecEngine(target), "spec": SpecEngine(target, drafter, points)}
    methods = [m for m in methods if drafter is not None or m not in ("eaglewire_chain", "eaglewire_tree")]
    for m in methods:  # warm-up
        _run_method(m, target, engines, prompts[:1], min(8, max_new), cfg)
    res: dict = {"max_new_tokens": max_new, "num_prompts": len(prompts), "methods": {},
                 "config": {"depth": cfg.depth, "top_k": cfg.top_k, "tree_depth": cfg.tree_depth,
                            "total_tokens": cfg.total_tokens}}
    baseline = None
    for m in methods:
        outs, secs, agg = _run_method(m, target, engines, prompts, max_new, cfg)
        if baseline is None:
            baseline = outs
        ntok = sum(len(o) for o in outs)
        row = {"tokens": ntok, "seconds": secs, "tokens_per_s": ntok / secs if secs else None,
               "differ_from_baseline": sum(a != b for a, b in zip(outs, baseline, strict=True))}
        if agg is not None and agg.steps:
            d = agg.to_dict()
            row.update(tau=d["tau"], accept_per_position=d["accept_per_position"],
                       accept_hist=d["accept_hist"], time_s=d["time_s"])
        res["methods"][m] = row
    base = res["methods"][methods[0]]["tokens_per_s"]
    for row in res["methods"].values():
        row["speedup"] = row["tokens_per_s"] / base if base and row["tokens_per_s"] else None
    res["greedy_outputs_match"] = all(r["differ_from_baseline"] == 0 for r in res["methods"].values())
    return res


def markdown(res: dict) -> str:
    lines = [f"{res['num_prompts']} prompts, {res['max_new_tokens']} max new tokens, greedy\n",
             "| method | tokens/s | speedup | tau | acceptance (cumulative) | prompts differing |",
             "|---|---:|---:|---:|---|---:|"]
    for m, r in res["methods"].items():
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        acc = ", ".join(f"{a:.2f}" for a in r["accept_per_position"]["cumulative"]) if r.get("accept_per_position") else "-"
        lines.append(f"| {m} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}x | {tau} | {acc} | {r['differ_from_baseline']} |")
    verdict = "all greedy outputs matched the transformers baseline" if res["greedy_outputs_match"] else \
        "SOME GREEDY OUTPUTS DIFFER from the transformers baseline (see 'prompts differing')"
    lines.append(f"\n{verdict}.")
    return "\n".join(lines) + "\n"


def write_outputs(res: dict, out: Path) -> dict:
    """bench.json, bench.md and bench.png in ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(res, indent=2))
    (out / "bench.md").write_text(markdown(res))
    names = list(res["methods"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, [res["methods"][n]["tokens_per_s"] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        r = res["methods"][n]
        label = f"{r['speedup']:.2f}x" + (f"\ntau {r['tau']:.2f}" if r.get("tau") else "")
        ax.text(i, r["tokens_per_s"], label, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.set_title("greedy decoding, same prompts and budget")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=100)
    plt.close(fig)
    return {k: str(out / f"bench.{k}") for k in ("json", "md", "png")}
