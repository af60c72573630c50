"""Side-by-side benchmark: the same prompts and token budget for every method.

Methods: transformers ``generate`` greedy (the baseline), eaglewire plain
decoding, transformers prompt-lookup decoding (opt-in), eaglewire chain and
tree with an EAGLE-3 drafter, eaglewire block decoding (``eaglewire_dflash``,
``--depth`` drafts from one drafter forward per round) with a DFlash one, eaglewire parallel decoding
(``eaglewire_peagle``, the same count of drafts per forward) with a P-EAGLE one. Speedups are given against both transformers ``generate`` and our own
plain decoding: the plain engine is itself faster than ``generate`` (prepacked
head), and that part of a gain is not speculation's.
Every method is run once on a short warm-up first (first-call allocations
and oneDNN weight packing are not what a server pays per request). Greedy
outputs of every method are compared token-for-token with the baseline; the
count of prompts that differ is reported, since a speedup that changes the
output is not a speedup.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from eaglewire.decoding.dflash import BlockEngine, block_stats
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.metrics import Metrics
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.plots import pyplot

METHODS = ("hf_generate", "eaglewire_plain", "hf_prompt_lookup", "eaglewire_chain", "eaglewire_tree",
           "eaglewire_tree_lookup", "eaglewire_dflash", "eaglewire_peagle")
EAGLE3_METHODS = ("eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup")  # need an EAGLE-3 drafter
DEFAULT_METHODS = ("hf_generate", "eaglewire_plain", "eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup")
DFLASH_METHODS = ("hf_generate", "eaglewire_plain", "eaglewire_dflash")  # the default with a DFlash drafter
PEAGLE_METHODS = ("hf_generate", "eaglewire_plain", "eaglewire_peagle")  # the default with a P-EAGLE drafter
ONE_FORWARD = ("eaglewire_dflash", "eaglewire_peagle")  # K drafts from one drafter forward: a chain, vLLM-counted
LOOKUP_TOKENS = 6  # eaglewire_tree_lookup: the drafter's tree plus a context-lookup branch of up to 6 tokens


def _hf(target, ids: list[int], max_new: int, lookup: int | None) -> list[int]:
    x = torch.tensor([ids], device=target.device)
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.inference_mode():
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                    max_new_tokens=max_new, eos_token_id=target.eos_ids(),
                                    pad_token_id=target.eos_ids()[0], **kw)
    return out[0, x.shape[1]:].tolist()


def _run_one(method: str, target, engines: dict, ids: list[int], max_new: int, cfg: SpecConfig):
    """(output ids, seconds, Metrics or None) for one prompt."""
    t0 = time.perf_counter()
    if method.startswith("hf_"):
        out = _hf(target, ids, max_new, 10 if method == "hf_prompt_lookup" else None)
        return out, time.perf_counter() - t0, None
    mode = "chain" if method in ONE_FORWARD else method.split("_")[1]  # a block is a chain
    lookup = (cfg.lookup or LOOKUP_TOKENS) if method == "eaglewire_tree_lookup" else 0
    eng = engines["plain" if mode == "plain" else "spec"]
    r = eng.generate(ids, SpecConfig(**{**cfg.__dict__, "mode": mode, "max_new_tokens": max_new, "temperature": 0.0,
                                        "lookup": lookup}))
    return r.token_ids, time.perf_counter() - t0, r.metrics


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def _spread(xs: list[float]) -> dict:
    return {"median": _median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def run_bench(target, drafter, points, prompts: list[list[int]], max_new: int,
              cfg: SpecConfig | None = None, methods=METHODS, categories: list[str] | None = None,
              repeats: int = 1, progress: bool = True, draft_weights: str = "fp32") -> dict:
    """Every method on every prompt, interleaved per prompt (the order rotates), ``repeats`` times.

    Interleaving puts machine noise on all methods alike; throughput ratios are
    formed per repeat (same prompts, same minutes) and reported as median and
    range. Greedy outputs of every method are compared with the first method's.
    """
    cfg = (cfg or SpecConfig()).resolved(target.device)  # so the result records the threshold used
    categories = categories or ["all"] * len(prompts)
    dflash, peagle = isinstance(drafter, DFlashDrafter), isinstance(drafter, PEagleDrafter)
    engines = {"plain": SpecEngine(target), "spec": BlockEngine(target, drafter) if dflash else
               ParallelEngine(target, drafter, points) if peagle else
               SpecEngine(target, drafter, points, draft_weights=draft_weights)}
    methods = [m for m in methods if (m not in EAGLE3_METHODS or (drafter is not None and not dflash and not peagle))
               and (m != "eaglewire_dflash" or dflash) and (m != "eaglewire_peagle" or peagle)]
    for m in methods:  # warm-up: first-call allocations and weight packing are not per-request costs
        _run_one(m, target, engines, prompts[0], min(8, max_new), cfg)
    secs = {m: [[0.0] * len(prompts) for _ in range(repeats)] for m in methods}
    ntok = {m: [0] * len(prompts) for m in methods}
    outs = {m: [None] * len(prompts) for m in methods}
    metrics = {m: [Metrics() for _ in prompts] for m in methods}
    bar = tqdm(total=repeats * len(prompts) * len(methods), desc="bench", unit="run", disable=not progress, dynamic_ncols=True)
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            k = (r * len(prompts) + i) % len(methods)
            for m in methods[k:] + methods[:k]:
                out, sec, met = _run_one(m, target, engines, ids, max_new, cfg)
                secs[m][r][i] = sec
                if r == 0:
                    outs[m][i], ntok[m][i] = out, len(out)
                    if met is not None:
                        metrics[m][i] = met
                bar.update(1)
    bar.close()
    res = {"max_new_tokens": max_new, "num_prompts": len(prompts), "repeats": repeats, "interleaved": True,
           "methods": {}, "config": {"depth": cfg.depth, "top_k": cfg.top_k, "tree_depth": cfg.tree_depth,
                                      "total_tokens": cfg.total_tokens, "min_prob": cfg.min_prob,
                                      "gate": cfg.gate, "draft_weights": engines["spec"].draft.weights
                                      if drafter is not None and not dflash and not peagle else None,
                                      "drafter": "dflash" if dflash else "p-eagle" if peagle else
                                      "eagle3" if drafter is not None else None}}
    if dflash:
        res["config"]["block_size"] = drafter.config.block_size
    base = methods[0]
    for m in methods:
        tps = [sum(ntok[m]) / sum(secs[m][r]) for r in range(repeats)]
        row = {"tokens": sum(ntok[m]), "seconds": _median([sum(secs[m][r]) for r in range(repeats)]),
               "tokens_per_s": _median(tps), "tokens_per_s_spread": _spread(tps),
               "differ_from_baseline": sum(a != b for a, b in zip(outs[m], outs[base], strict=True))}
        agg = Metrics()
        for x in metrics[m]:
            agg.add(x)
        if agg.steps:
            d = agg.to_dict()
            row.update(tau=d["tau"], accept_per_position=d["accept_per_position"], accept_hist=d["accept_hist"],
                       time_s=d["time_s"], verify_steps=d["verify_steps"], drafted_tokens=d["drafted_tokens"],
                       rounds_without_drafts=d["rounds_without_drafts"])
            if m in ONE_FORWARD:
                row.update(block_stats(agg))
        res["methods"][m] = row
    _speedups(res, methods, secs, ntok, repeats)
    res["categories"] = _per_category(methods, secs, ntok, metrics, categories, repeats)
    res["greedy_outputs_match"] = all(r["differ_from_baseline"] == 0 for r in res["methods"].values())
    return res


# (top_k, depth, total, min_prob)
SHAPES = ((2, 2, 5, 0.0), (3, 2, 7, 0.0), (2, 3, 7, 0.0), (3, 3, 8, 0.0), (3, 4, 10, 0.0), (4, 3, 10, 0.0),
          (3, 5, 12, 0.0), (3, 2, 7, 0.05), (3, 3, 8, 0.05), (3, 4, 10, 0.1), (3, 3, 8, 0.2))


def auto_shape(target, drafter, points, prompts: list[list[int]], max_new: int, cfg: SpecConfig,
               shapes=SHAPES, draft_weights: str = "fp32") -> dict:
    """Pick the tree (top_k, depth, total tokens, min_prob) with the best throughput over plain decoding.

    Each shape runs right after a plain run of the same prompt (noise falls on
    both alike); the score is the ratio of summed throughputs. Returns the
    winner and every shape's tau and ratio.
    """
    engines = {"plain": SpecEngine(target), "spec": SpecEngine(target, drafter, points, draft_weights=draft_weights)}
    _run_one("eaglewire_tree", target, engines, prompts[0], 8, cfg)
    rows = []
    for k, d, n, mp in shapes:
        c = SpecConfig(**{**cfg.__dict__, "top_k": k, "tree_depth": d, "total_tokens": n, "min_prob": mp})
        plain_s = tree_s = 0.0
        agg = Metrics()
        ntok = 0
        for ids in prompts:
            out_p, sp, _ = _run_one("eaglewire_plain", target, engines, ids, max_new, c)
            out_t, st, met = _run_one("eaglewire_tree", target, engines, ids, max_new, c)
            plain_s, tree_s, ntok = plain_s + sp, tree_s + st, ntok + len(out_t)
            agg.add(met)
        rows.append({"top_k": k, "tree_depth": d, "total_tokens": n, "min_prob": mp, "tau": agg.tau,
                     "speedup_vs_plain": plain_s / tree_s})
    best = max(rows, key=lambda r: r["speedup_vs_plain"])
    return {"best": best, "shapes": rows, "prompts": len(prompts), "max_new_tokens": max_new}


def _ratio(secs, ntok, a: str, b: str, r: int, idx=None) -> float:
    """Throughput of a over throughput of b in repeat r (over the prompts idx)."""
    idx = range(len(ntok[a])) if idx is None else idx
    ta = sum(ntok[a][i] for i in idx) / sum(secs[a][r][i] for i in idx)
    tb = sum(ntok[b][i] for i in idx) / sum(secs[b][r][i] for i in idx)
    return ta / tb


def _speedups(res: dict, methods: list[str], secs, ntok, repeats: int) -> None:
    """speedup (vs the first method, transformers generate) and vs eaglewire plain, per repeat -> median/range."""
    refs = [(k, m) for k, m in (("speedup", methods[0]), ("speedup_vs_plain", "eaglewire_plain")) if m in methods]
    for m in methods:
        row = res["methods"][m]
        for key, ref in refs:
            rs = [_ratio(secs, ntok, m, ref, r) for r in range(repeats)]
            row[key], row[key + "_spread"] = _median(rs), _spread(rs)
        if "speedup_vs_plain" in row:  # per-prompt ratios: how much of the gain is every prompt's
            per = [_ratio(secs, ntok, m, "eaglewire_plain", 0, [i]) for i in range(len(ntok[m]))]
            row["speedup_vs_plain_per_prompt"] = _spread(per)
    if "eaglewire_plain" in methods and methods[0] != "eaglewire_plain":
        res["plain_vs_" + methods[0]] = res["methods"]["eaglewire_plain"]["speedup"]


def _per_category(methods, secs, ntok, metrics, categories: list[str], repeats: int) -> dict:
    out = {}
    for c in dict.fromkeys(categories):
        idx = [i for i, x in enumerate(categories) if x == c]
        row = {"prompts": len(idx)}
        for m in methods:
            agg = Metrics()
            for i in idx:
                agg.add(metrics[m][i])
            cell = {"tau": agg.tau} if agg.steps else {}
            if "eaglewire_plain" in methods:
                cell["speedup_vs_plain"] = _median([_ratio(secs, ntok, m, "eaglewire_plain", r, idx) for r in range(repeats)])
            row[m] = cell
        out[c] = row
    return out


def fmt_ratio(row: dict, key: str) -> str:
    """``1.23x``, with ``(min-max)`` over repeats when there were several; ``-`` when absent."""
    if row.get(key) is None:
        return "-"
    sp = row.get(key + "_spread")
    v = f"{row[key]:.2f}x"
    return v + (f" ({sp['min']:.2f}-{sp['max']:.2f})" if sp and sp["n"] > 1 else "")


def markdown(res: dict) -> str:
    c = res.get("config", {})
    shape = (f"DFlash blocks of {c.get('depth')} drafts (block_size {c.get('block_size')})"
             if c.get("drafter") == "dflash" else f"P-EAGLE: {c.get('depth')} parallel drafts per round"
             if c.get("drafter") == "p-eagle" else f"chain depth {c.get('depth')}, tree top_k {c.get('top_k')} / depth {c.get('tree_depth')} / "
             f"{c.get('total_tokens')} tokens, min_prob {c.get('min_prob', 0.0)}")
    lines = [f"{res['num_prompts']} prompts, {res['max_new_tokens']} max new tokens, greedy, methods interleaved per "
             f"prompt, {res['repeats']} repeat(s): median (range over repeats); {shape}\n",
             "| method | tokens/s | vs transformers generate | vs eaglewire plain | tau | acceptance (cumulative) | prompts differing |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for m, r in res["methods"].items():
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        acc = ", ".join(f"{a:.2f}" for a in r["accept_per_position"]["cumulative"]) if r.get("accept_per_position") else "-"
        lines.append(f"| {m} | {r['tokens_per_s']:.2f} | {fmt_ratio(r, 'speedup')} | {fmt_ratio(r, 'speedup_vs_plain')} | {tau} | {acc} | "
                     f"{r['differ_from_baseline']} |")
    gated = [(m, r) for m, r in res["methods"].items() if r.get("rounds_without_drafts")]
    for m, r in gated:  # tau 1.00 must never hide that the threshold drafted nothing
        lines.append(f"\n{m}: {r['rounds_without_drafts']} of {r['verify_steps']} rounds had no draft above --min-prob "
                     f"{c.get('min_prob')}; those rounds decoded one token each and count as tau 1.")
    for k, v in res.items():
        if k.startswith("plain_vs_"):
            lines.append(f"\neaglewire plain decoding runs at {v:.2f}x {k[len('plain_vs_'):]} (no speculation): "
                         "speculation's own gain is the 'vs eaglewire plain' column.")
    cats = res.get("categories") or {}
    spec = [m for m in res["methods"] if m in (*EAGLE3_METHODS, *ONE_FORWARD)]
    if len(cats) > 1 and spec:
        lines += ["", "| category | prompts | " + " | ".join(f"{m} tau | {m} vs plain" for m in spec) + " |",
                  "|---|---:|" + "---:|" * (2 * len(spec))]
        for c, row in cats.items():
            cells = []
            for m in spec:
                cell = row.get(m, {})
                cells += [f"{cell['tau']:.2f}" if cell.get("tau") else "-",
                          f"{cell['speedup_vs_plain']:.2f}x" if "speedup_vs_plain" in cell else "-"]
            lines.append(f"| {c} | {row['prompts']} | " + " | ".join(cells) + " |")
    verdict = "all greedy outputs matched the transformers baseline" if res["greedy_outputs_match"] else \
        "SOME GREEDY OUTPUTS DIFFER from the transformers baseline (see 'prompts differing')"
    lines.append(f"\n{verdict}.")
    return "\n".join(lines) + "\n"


def speed_series(res: dict) -> dict:
    """What the speed chart draws: eaglewire's methods against ONE baseline, eaglewire plain decoding.

    Ratios to transformers `generate` stay in the table: beside the plain
    ratio they mix the engine's own gain with speculation's. Error bars are
    the range over repeats when there were several, else over prompts (the
    per-prompt ratios of the one repeat), so they are never absent silently.
    """
    names = [n for n in res["methods"] if not n.startswith("hf_")]
    rows = [res["methods"][n] for n in names]
    reps = res.get("repeats", 1)
    key = "speedup_vs_plain_spread" if reps > 1 else "speedup_vs_plain_per_prompt"
    spread_of = f"{reps} repeats" if reps > 1 else f"{res.get('num_prompts', '?')} prompts"
    has_plain = "eaglewire_plain" in names
    spec = [(n, r) for n, r in zip(names, rows) if has_plain and n != "eaglewire_plain"]
    return {"baseline": "eaglewire_plain" if has_plain else None, "spread_of": spread_of,
            "speedup_methods": [n for n, _ in spec],
            "speedup_vs_plain": [r["speedup_vs_plain"] for _, r in spec],
            "speedup_range": [_range(r.get(key), r["speedup_vs_plain"]) for _, r in spec],
            "tps_methods": names, "tokens_per_s": [r["tokens_per_s"] for r in rows],
            "tps_range": [_range(r.get("tokens_per_s_spread"), r["tokens_per_s"]) for r in rows]}


def _range(sp: dict | None, v: float) -> tuple[float, float]:
    """(below, above) ``v`` for an error bar; zero when one run gives no spread."""
    if not sp or sp.get("n", 1) < 2:
        return 0.0, 0.0
    return max(v - sp["min"], 0.0), max(sp["max"] - v, 0.0)


def _yerr(ranges: list[tuple[float, float]]):
    """matplotlib's yerr, or None when no bar has a spread (zero-length bars would still draw caps)."""
    return list(zip(*ranges)) if any(lo or hi for lo, hi in ranges) else None


def plot_speed(res: dict, path: Path) -> dict:
    """The speed chart (speedup vs eaglewire plain, tokens/s) at ``path``; returns the series it drew."""
    plt = pyplot()

    s = speed_series(res)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 4]})
    if s["speedup_methods"]:
        x = range(len(s["speedup_methods"]))
        a.bar(x, s["speedup_vs_plain"], yerr=_yerr(s["speedup_range"]), capsize=4, color="tab:green", ecolor="0.3")
        a.axhline(1.0, color="0.4", ls="--", lw=1, label="eaglewire plain decoding = 1x")
        for i, v in enumerate(s["speedup_vs_plain"]):
            a.annotate(f"{v:.2f}x", (i - 0.2, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
        a.set_xticks(list(x), [n.removeprefix("eaglewire_") for n in s["speedup_methods"]])
        a.set(ylabel="speedup vs eaglewire plain decoding (x)",
              title=f"speedup; error bars: range over {s['spread_of']}")
        a.legend(fontsize=7, loc="upper left")
    else:
        a.text(0.5, 0.5, "no eaglewire_plain run: no speedup to draw", ha="center", transform=a.transAxes)
        a.set_axis_off()
    x = range(len(s["tps_methods"]))
    b.bar(x, s["tokens_per_s"], yerr=_yerr(s["tps_range"]), capsize=4, color="tab:blue", ecolor="0.3")
    for i, v in enumerate(s["tokens_per_s"]):
        b.annotate(f"{v:.1f}", (i - 0.2, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    b.set_xticks(list(x), [n.removeprefix("eaglewire_") for n in s["tps_methods"]])
    b.set(ylabel="tokens/s", title="throughput, greedy, same prompts and budget" +
          ("; error bars: range over repeats" if res.get("repeats", 1) > 1 else " (1 repeat)"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return s


def write_outputs(res: dict, out: Path) -> dict:
    """bench.json, bench.md and bench.png in ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "bench.json", res)
    (out / "bench.md").write_text(markdown(res))
    plot_speed(res, out / "bench.png")
    return {k: str(out / f"bench.{k}") for k in ("json", "md", "png")}
