"""llama.cpp plain and llama.cpp + our EAGLE-3 drafter beside eaglewire's own decoding, in one run on this CPU.

Usage: python benchmarks/bench_llamacpp.py [--run runs/demo-quick] [--prompts 16] [--max-new-tokens 64]
       [--depths 2,3,4] [--p-mins 0,0.5] [--drafter-types f16,q8_0] [--target-types f32,q4_1] [--threads 2]
       [--no-with-eaglewire] [--chain-depth 3] [--json PATH]

Why: llama.cpp is what most people run a small model with on a CPU, so the
question a user of `export --format gguf` asks is whether our drafter makes
*llama.cpp* faster, at which draft depth and drafter tensor type, and how that
compares with eaglewire's own engine on the same prompts. Every llama-server
(plain, and one per depth x drafter type, per target type) is started once and
kept up; each held-out prompt then goes through every method in turn, the
order rotating per prompt, so drift of the shared VM hits all methods alike.
Speed is generated tokens over the wall seconds of each request (HTTP
included for llama.cpp), greedy; llama.cpp's own `predicted_per_second`
(decode only, no prompt eval, no HTTP) is shown beside it. llama.cpp drafts
ungated (`--spec-draft-p-min 0`) unless `--p-mins` names gates, so eaglewire's
chain is run ungated too; its tree runs with the engine's defaults (CPU
gating), as users get it. A gate stops a round's drafting at the first draft
whose probability is under it (a round without drafts is a plain decode step),
which trades acceptance for verify rows; eaglewire's prediction of each
gated server drafts by the same rule (`--gate step`: each step's best draft
probability among its 10 best, as llama.cpp's draft sampler computes it).

Mean acceptance length = 1 + accepted / rounds; llama.cpp names no rounds, so
rounds = generated - accepted - prompts (every token after a prompt's first
comes from a verify round). The draft time of llama.cpp comes from its own
speculative statistics (`dur(b,g,a)`, printed at `-lv 4`), read from the
server log; the rest of `predicted_ms` is verification and sampling.
Served acceptance on the f32 target is printed next to eaglewire's prediction
(`doctor.live.predicted_acceptance`) at each depth. Start-up seconds are
those of `LlamaServer.start` (its health poll has a 2 s step).

`--batch-costs` also asks each plain server what a verify of k rows costs:
a prompt whose KV is cached is extended by k of its own generated tokens and
llama.cpp's `timings.prompt_ms` for those k rows is set against its decode
time per token (medians over the prompts). That is the verify's share of a
round a drafter must pay for; eaglewire's own figure is
`bench_decoding.py`'s "x step".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.bench import LOOKUP_TOKENS
from eaglewire.decoding.compat import load_drafter_for
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.metrics import Metrics
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.engines.llama_env import find_server
from eaglewire.engines.llama_server import LlamaServer, LlamaSpec, complete
from eaglewire.engines.vllm_server import free_port, http_json
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.gguf import GGUF_TYPES, target_gguf
from eaglewire.saved.checkpoint import read_provenance, resolve_dir
from eaglewire.targets.load import load_target

TARGET_TYPES = (*GGUF_TYPES, "q4_1")  # q4_1: the shipped default GGUF, as users run it
_STATS = re.compile(r"statistics\s+draft-eagle3:.*dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")


def _types(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    out = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in allowed]
    if bad or not out:
        raise SystemExit(f"{flag} {text!r}: expected a comma-separated list of {', '.join(allowed)}")
    return out


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=Path("runs/demo-quick"),
                    help="a run directory (its train/drafter) or a drafter checkpoint")
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts, round-robin over categories")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--depths", default="2,3,4", help="llama.cpp draft depths (--spec-draft-n-max)")
    ap.add_argument("--p-mins", default="0", help="llama.cpp draft gates (--spec-draft-p-min), comma-separated")
    ap.add_argument("--drafter-types", default="f16", help=f"drafter GGUF types ({', '.join(GGUF_TYPES)})")
    ap.add_argument("--target-types", default="f32", help=f"target GGUF types ({', '.join(TARGET_TYPES)}; "
                    "q4_1 = the shipped default GGUF)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t/-tb/-td/-tbd and torch threads")
    ap.add_argument("--with-eaglewire", action=argparse.BooleanOptionalAction, default=True,
                    help="also run eaglewire plain, chain, tree and tree + lookup")
    ap.add_argument("--chain-depth", type=int, default=3, help="eaglewire chain depth (ungated)")
    ap.add_argument("--llama-server", default="", help="a llama-server binary (default: the managed build)")
    ap.add_argument("--batch-costs", default="", help="also measure llama.cpp's k-row batch against its decode "
                    "step on the plain servers, e.g. 1,2,3,4,8 (empty: skip)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here ('-' prints it)")
    a = ap.parse_args()
    a.depths = sorted({int(d) for d in a.depths.split(",") if d.strip()})
    if not a.depths or min(a.depths) < 1:
        raise SystemExit(f"--depths {a.depths}: expected positive integers")
    try:
        a.p_mins = sorted({float(p) for p in a.p_mins.split(",") if p.strip()})
    except ValueError:
        raise SystemExit(f"--p-mins {a.p_mins!r}: expected comma-separated probabilities") from None
    if not a.p_mins or not all(0.0 <= p < 1.0 for p in a.p_mins):
        raise SystemExit(f"--p-mins {a.p_mins}: expected probabilities in [0, 1)")
    a.drafter_types = _types(a.drafter_types, GGUF_TYPES, "--drafter-types")
    a.target_types = _types(a.target_types, TARGET_TYPES, "--target-types")
    return a


def _drafter_dir(run: Path) -> Path:
    return run / "train" / "drafter" if (run / "train" / "drafter").is_dir() else resolve_dir(run)


def _export_drafters(ckpt: Path, types: list[str], work: Path) -> dict[str, Path]:
    """One GGUF export per drafter type, under this run's temporary directory."""
    out = {}
    for t in types:
        t0 = time.perf_counter()
        d = Path(run_export(ExportConfig(ckpt=ckpt, format="gguf", out=work / f"drafter-{t}", gguf_type=t,
                                         force=True))["out"])
        out[t] = d / "drafter.gguf"
        print(f"[bench] drafter {t}: {out[t]} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out


def _server_specs(a, source: str, drafters: dict[str, Path]) -> dict[str, LlamaSpec]:
    """Method name -> server spec: per target type, plain and one per (drafter type, depth)."""
    specs = {}
    verbose = ["-lv", "4"]  # trace level: the speculative statistics with draft time (same flag for all)
    for tt in a.target_types:
        tg = target_gguf(source, tt)
        specs[f"llama.cpp {tt} plain"] = LlamaSpec(tg, None, port=free_port(), threads=a.threads, extra=verbose)
        for dt, path in drafters.items():
            for d in a.depths:
                for pm in a.p_mins:
                    gate = f" p{pm:g}" if pm else ""
                    specs[f"llama.cpp {tt} + drafter {dt} d{d}{gate}"] = LlamaSpec(
                        tg, path, depth=d, port=free_port(), threads=a.threads, p_min=pm, extra=verbose)
    return specs


def _llama_call(url: str):
    def call(ids: list[int], max_new: int):
        toks, t = complete(url, ids, max_new)
        return toks, t
    return call


def _eaglewire_call(engine: SpecEngine, cfg: SpecConfig):
    def call(ids: list[int], max_new: int):
        r = engine.generate(ids, dataclasses.replace(cfg, max_new_tokens=max_new))
        return r.token_ids, r.metrics
    return call


def _eaglewire_methods(target, drafter, points, chain_depth: int) -> dict:
    plain, spec = SpecEngine(target), SpecEngine(target, drafter, points)
    return {"eaglewire plain": _eaglewire_call(plain, SpecConfig(mode="plain")),
            f"eaglewire chain {chain_depth} (ungated)":
                _eaglewire_call(spec, SpecConfig(mode="chain", depth=chain_depth, min_prob=0.0)),
            "eaglewire tree (default)": _eaglewire_call(spec, SpecConfig(mode="tree")),
            f"eaglewire tree + lookup {LOOKUP_TOKENS}": _eaglewire_call(spec, SpecConfig(mode="tree", lookup=LOOKUP_TOKENS))}


def _start_all(stack: contextlib.ExitStack, binary: Path, specs: dict[str, LlamaSpec], work: Path):
    """Start every server (kept up for the whole run); (calls, start-up seconds, log paths) per method."""
    calls, startup, logs = {}, {}, {}
    for i, (name, spec) in enumerate(specs.items()):
        logs[name] = work / f"server-{i}.log"
        t0 = time.perf_counter()
        srv = stack.enter_context(LlamaServer(binary, spec, logs[name]).start(timeout=600))
        startup[name] = time.perf_counter() - t0
        calls[name] = _llama_call(srv.spec.url)
        print(f"[bench] {name}: up in {startup[name]:.1f} s at {srv.spec.url}", file=sys.stderr)
    return calls, startup, logs


def _run_interleaved(calls: dict, prompts: list[list[int]], max_new: int) -> tuple[dict, dict]:
    """Every method on every prompt, the order rotating per prompt; a short untimed warm-up first.

    Returns (records per method: [(tokens, wall seconds, timings or Metrics)], warm-up info per method)."""
    warm = {name: call(prompts[0], min(8, max_new))[1] for name, call in calls.items()}
    names = list(calls)
    recs = {n: [] for n in names}
    t_start = time.perf_counter()
    for i, ids in enumerate(prompts):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            toks, info = calls[n](ids, max_new)
            recs[n].append((toks, time.perf_counter() - t0, info))
        print(f"[bench] prompt {i + 1}/{len(prompts)} ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
    return recs, warm


def _draft_ms(log: Path, n_prompts: int) -> float | None:
    """Draft time of the timed requests from llama.cpp's cumulative statistics (one line per request)."""
    try:
        cum = [sum(float(x) for x in m.groups()) for m in _STATS.finditer(log.read_text(errors="replace"))]
    except OSError:
        return None
    if len(cum) != n_prompts + 1:  # warm-up + one per prompt; otherwise the lines are not ours to pair
        return None
    return cum[-1] - cum[0]


def _cached(url: str, ids: list[int], max_new: int) -> dict:
    """One greedy request that keeps (and reuses) the server's prompt cache."""
    body = {"prompt": ids, "n_predict": max_new, "temperature": 0.0, "top_k": 1, "seed": 0, "cache_prompt": True,
            "return_tokens": True, "n_probs": 0}
    return http_json(url, "/completion", body, timeout=600)


def batch_costs(url: str, prompts: list[list[int]], sizes: list[int], max_new: int = 32) -> dict:
    """llama.cpp's cost of k rows in one batch (a verify's size) in its own decode steps: per prompt, the prompt
    is cached, then extended by k of the tokens generated after it; medians over the prompts."""
    step, rows = [], {k: [] for k in sizes}
    for ids in prompts:
        r = _cached(url, ids, max_new)
        gen, step_ms = r.get("tokens") or [], r["timings"].get("predicted_per_token_ms")
        if step_ms:
            step.append(step_ms)
        for k in sizes:
            if len(gen) < k:
                continue
            _cached(url, ids, 1)  # the cache holds the prompt again
            t = _cached(url, ids + gen[:k], 1)["timings"]
            if t.get("prompt_n") == k:  # exactly the k new rows were evaluated
                rows[k].append(t["prompt_ms"])
    if not step:
        return {}
    dec = statistics.median(step)
    return {"decode_ms": dec, "rows": {k: {"ms": statistics.median(v), "steps": statistics.median(v) / dec,
                                          "n": len(v)} for k, v in rows.items() if v}}


def _llama_row(recs: list, n_prompts: int, spec: LlamaSpec, draft_ms: float | None) -> dict:
    timings = [t for _, _, t in recs]
    gen = sum(len(toks) for toks, _, _ in recs)
    pred_n = sum(t.get("predicted_n", 0) for t in timings)
    pred_ms = sum(t.get("predicted_ms", 0.0) for t in timings)
    row = {"tokens": gen, "predicted_n": pred_n, "predicted_ms": pred_ms,
           "predicted_per_second": 1000 * pred_n / pred_ms if pred_ms else None}
    if spec.drafter_gguf:
        depth = spec.depth
        drafted = sum(t.get("draft_n", 0) for t in timings)
        accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
        rounds = pred_n - accepted - n_prompts
        row.update(depth=depth, p_min=spec.p_min, drafted=drafted, accepted=accepted, rounds=rounds, rounds_by_depth=drafted / depth,
                   mean_acceptance_length=1 + accepted / rounds if rounds > 0 else None, draft_ms=draft_ms,
                   draft_share=draft_ms / pred_ms if draft_ms is not None and pred_ms else None)
    return row


def _eaglewire_row(recs: list) -> dict:
    agg = Metrics()
    for _, _, m in recs:
        agg.add(m)
    d = agg.to_dict()
    row = {"tokens": sum(len(toks) for toks, _, _ in recs), "time_s": d["time_s"]}
    if agg.steps:
        t = d["time_s"]
        decode = t["total"] - t["prefill"]
        row.update(drafted=d["drafted_tokens"], accepted=d["accepted_tokens"], rounds=d["verify_steps"],
                   rounds_without_drafts=d["rounds_without_drafts"], mean_acceptance_length=d["tau"],
                   draft_ms=1000 * t["draft"], verify_ms=1000 * t["verify"],
                   draft_share=t["draft"] / decode if decode > 0 else None)
    return row


def _plain_of(name: str) -> str:
    return f"llama.cpp {name.split()[1]} plain" if name.startswith("llama.cpp") else "eaglewire plain"


def _summarize(recs: dict, specs: dict, draft_ms: dict, n_prompts: int) -> dict:
    rows = {}
    for name, rs in recs.items():
        if name in specs:
            spec = specs[name]
            row = _llama_row(rs, n_prompts, spec, draft_ms.get(name))
        else:
            row = _eaglewire_row(rs)
        row["seconds"] = sum(s for _, s, _ in rs)
        row["tok_s"] = row["tokens"] / row["seconds"]
        base = recs.get(_plain_of(name))
        row["outputs_equal_plain"] = sum(a[0] == b[0] for a, b in zip(rs, base)) if base else None
        rows[name] = row
    llama_ref = next((n for n in rows if n.startswith("llama.cpp f32 plain")),
                     next((n for n in rows if n.endswith(" plain") and n.startswith("llama.cpp")), None))
    for name, row in rows.items():
        ref = _plain_of(name) if name.startswith("llama.cpp") else llama_ref
        row["vs_llama_plain"] = row["tok_s"] / rows[ref]["tok_s"] if ref in rows else None
        ew = rows.get("eaglewire plain")
        row["vs_eaglewire_plain"] = row["tok_s"] / ew["tok_s"] if ew else None
    return rows


def _predicted(engine: SpecEngine, prompts, depths: list[int], p_mins: list[float], max_new: int,
               rows: dict) -> list[dict]:
    """eaglewire's prediction (chain, fp32, gated by llama.cpp's rule at each p-min) beside what llama.cpp f32
    served at that depth and gate, counted the way the rows count it: rounds = every verify or plain step after
    a prompt's first token, so a round the gate left without drafts counts as 1 (llama.cpp's counters, and
    `doctor live`, count only rounds that drafted); drafted and accepted tokens in total."""
    out = []
    for d in depths:
        for pm in p_mins:
            cfg = SpecConfig(mode="chain", depth=d, min_prob=pm, gate="step", max_new_tokens=max_new)
            steps = [s for ids in prompts for s in engine.generate(ids, cfg).metrics.steps]
            acc = sum(s.accepted for s in steps)
            served = {n.split(" + drafter ")[1].split()[0]: {k: r.get(k) for k in ("mean_acceptance_length",
                                                                                   "drafted", "accepted")}
                      for n, r in rows.items() if n.startswith("llama.cpp f32 + drafter ") and r.get("depth") == d
                      and (r.get("p_min") or 0.0) == pm}
            out.append({"depth": d, "p_min": pm, "predicted": 1 + acc / len(steps) if steps else None,
                        "predicted_drafted": sum(s.drafted for s in steps), "predicted_accepted": acc,
                        "predicted_rounds": len(steps), "served_f32_by_drafter_type": served})
    return out


def _fmt(x, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _report(res: dict) -> None:
    c = res["config"]
    print(f"{c['prompts']} held-out prompts x {c['max_new_tokens']} tokens, greedy, {c['threads']} threads, "
          f"target {c['target']}, drafter {c['drafter']}; llama.cpp {res['llama_server']}")
    print("| method | tok/s | llama.cpp own tok/s | vs llama.cpp plain | vs eaglewire plain | acc len "
          "| drafted / accepted | = plain | draft share | start-up s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in res["methods"].items():
        da = f"{r['drafted']} / {r['accepted']}" if "drafted" in r else "-"
        eq = "-" if r["outputs_equal_plain"] is None else f"{r['outputs_equal_plain']}/{c['prompts']}"
        print(f"| {name} | {r['tok_s']:.1f} | {_fmt(r.get('predicted_per_second'), '.1f')} "
              f"| {_fmt(r['vs_llama_plain'], '.2f', 'x')} | {_fmt(r['vs_eaglewire_plain'], '.2f', 'x')} "
              f"| {_fmt(r.get('mean_acceptance_length'), '.2f')} | {da} | {eq} "
              f"| {_fmt(r.get('draft_share'), '.0%')} | {_fmt(res['startup_s'].get(name), '.1f')} |")
    print("vs llama.cpp plain: the same target type's plain server (eaglewire rows: the f32 one if run, "
          "the weights eaglewire runs); draft share: draft time / decode time (llama.cpp: predicted_ms)")
    if res.get("eaglewire_plain_equals_llama_f32_plain") is not None:
        print(f"eaglewire plain = llama.cpp f32 plain on {res['eaglewire_plain_equals_llama_f32_plain']}/"
              f"{c['prompts']} prompts")
    for name, bc in (res.get("batch_costs") or {}).items():
        if bc:
            print(f"{name}: decode {bc['decode_ms']:.1f} ms/token; k rows in one batch, in decode steps: "
                  + ", ".join(f"{k}: {v['steps']:.2f} ({v['ms']:.1f} ms)" for k, v in bc["rows"].items()))
    for p in res.get("acceptance_predicted_vs_served", []):
        served = ", ".join(f"{t} {_fmt(v['mean_acceptance_length'], '.3f')} ({v['drafted']} / {v['accepted']})"
                           for t, v in p["served_f32_by_drafter_type"].items())
        gate = f", p-min {p['p_min']:g}" if p.get("p_min") else ""
        print(f"depth {p['depth']}{gate}: mean acceptance length predicted (eaglewire, fp32) {_fmt(p['predicted'], '.3f')}"
              f" ({p['predicted_drafted']} drafted / {p['predicted_accepted']} accepted); served by llama.cpp f32 "
              f"target: {served or '-'}")


def _bench(a, ckpt: Path, source: str, target, drafter, points, prompts, work: Path) -> dict:
    binary = find_server(a.llama_server)
    specs = _server_specs(a, source, _export_drafters(ckpt, a.drafter_types, work))
    with contextlib.ExitStack() as stack:
        calls, startup, logs = _start_all(stack, binary, specs, work)
        calls_url = {n: s.url for n, s in specs.items()}
        if a.with_eaglewire:
            calls.update(_eaglewire_methods(target, drafter, points, a.chain_depth))
        recs, warm = _run_interleaved(calls, prompts, a.max_new_tokens)
        sizes = [int(k) for k in a.batch_costs.split(",") if k.strip()]
        costs = {n: batch_costs(calls_url[n], prompts, sizes) for n in calls_url if sizes and not specs[n].drafter_gguf}
    draft_ms = {n: _draft_ms(logs[n], len(prompts)) for n in specs if specs[n].drafter_gguf}
    rows = _summarize(recs, specs, draft_ms, len(prompts))
    res = {"llama_server": str(binary), "startup_s": startup, "methods": rows, "batch_costs": costs,
           "timings_keys": sorted(next((w for n, w in warm.items() if n in specs and specs[n].drafter_gguf), {})),
           "commands": {n: LlamaServer(binary, s, logs[n]).command for n, s in specs.items()}}
    ew, lp = recs.get("eaglewire plain"), recs.get("llama.cpp f32 plain")
    res["eaglewire_plain_equals_llama_f32_plain"] = sum(x[0] == y[0] for x, y in zip(ew, lp)) if ew and lp else None
    return res


def main() -> None:
    a = _parse()
    torch.set_num_threads(a.threads)
    ckpt = _drafter_dir(a.run)
    source = read_provenance(ckpt).target.source or "default"
    target = load_target(source)
    drafter, points, _ = load_drafter_for(target, ckpt)
    prompts, _ = encode_prompt_file(SpecEngine(target), heldout_prompts_path(), a.prompts)
    with tempfile.TemporaryDirectory(prefix="bench_llamacpp-") as tmp:
        res = _bench(a, ckpt, source, target, drafter, points, prompts, Path(tmp))
    res["config"] = {"run": str(a.run), "drafter": str(ckpt), "target": source, "prompts": len(prompts),
                     "max_new_tokens": a.max_new_tokens, "depths": a.depths, "p_mins": a.p_mins, "drafter_types": a.drafter_types,
                     "target_types": a.target_types, "threads": a.threads, "batch_costs": a.batch_costs, "with_eaglewire": a.with_eaglewire,
                     "chain_depth": a.chain_depth}
    if "f32" in a.target_types:
        res["acceptance_predicted_vs_served"] = _predicted(SpecEngine(target, drafter, points), prompts, a.depths,
                                                           a.p_mins, a.max_new_tokens, res["methods"])
    _report(res)
    if a.json is not None:
        text = json.dumps(res, indent=2)
        if str(a.json) == "-":
            print(text)
        else:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(text)


if __name__ == "__main__":
    main()
