"""What the demo report says, computed from the stage results (no rendering here).

Every sentence a newcomer reads first (the verdict, the caveats) is derived
from the numbers in the run, so a report regenerated from `stages/*.json`
says the same thing the run measured, and a test can check it on a made-up run.
The verdict's headline is fixed before the run: the method a deployment runs,
not the fastest of the day, so noise cannot pick it and no engine-less method
can be read as what one would get.
"""

from __future__ import annotations

import copy

from eaglewire.demo.deploy import FORMATS

# also the headline's order: the chain is what vLLM runs; the tree (SGLang's) and the lookup branch are fallbacks
SPEC = ("eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup")
# what each method is on an engine, with the benchmarked shape (bench's config) it ran in
ON_ENGINE = {"eaglewire_chain": "what vLLM runs, num_speculative_tokens {depth} = chain depth {depth}",
             "eaglewire_tree": "what SGLang runs, tree top_k {top_k} / depth {tree_depth} / {total_tokens} tokens",
             "eaglewire_tree_lookup": "not deployable on an engine: the lookup branch has no engine flag"}
# the headline's call on its speedup range; only "faster" is drawn green
CALLS = {"faster": "faster over its whole range", "slower": "slower over its whole range",
         "within noise": "within noise (the range crosses 1.0)",
         "unranged": "no range (1 repeat of 1 prompt): not called a win or a loss"}
# checks that find a wrongly wired drafter; the rest of `doctor drafter` grades its quality
WIRING = {"dataset": None, "config": None, "drafter": {"points", "d2t"}}
CLEAR_GAIN = 1.05  # a speedup the verdict presents as a gain; below it, a median under 1 is no contradiction
# WARNs the demo's user cannot act on from the demo (its preset fixes them): shown as INFO, with why
DEMO_INFO = {("drafter", "sample size"): "the preset fixes how many answers are held out; read the interval, "
                                          "not the point (the standard preset holds out more)"}


def best_method(bench: dict) -> tuple[str, dict] | None:
    """The speculative method with the highest speedup over eaglewire plain decoding."""
    cands = [(n, m) for n, m in bench.get("methods", {}).items() if n in SPEC and m.get("speedup_vs_plain")]
    return max(cands, key=lambda x: x[1]["speedup_vs_plain"]) if cands else None


def deployed_method(bench: dict) -> tuple[str, dict] | None:
    """The method the verdict leads with: the chain vLLM runs, else the first of SPEC the bench timed.

    Chosen by what a deployment runs, never by the result: picking the fastest
    after the run headlines whichever method the day's noise favoured, and
    often one no engine can run.
    """
    ms = bench.get("methods", {})
    return next(((n, ms[n]) for n in SPEC if (ms.get(n) or {}).get("speedup_vs_plain")), None)


def speedup_range(bench: dict, m: dict) -> dict | None:
    """The spread the bench recorded for a method: over repeats when it ran several, else over the one repeat's prompts."""
    sp = m.get("speedup_vs_plain_spread") or {}
    if bench.get("repeats", 1) > 1 and sp.get("n", 1) > 1:
        return {"min": sp["min"], "max": sp["max"], "median": sp["median"], "n": sp["n"], "of": "repeats"}
    pp = m.get("speedup_vs_plain_per_prompt") or {}
    if pp.get("n", 1) > 1:
        return {"min": pp["min"], "max": pp["max"], "median": pp["median"], "n": pp["n"], "of": "prompts"}
    return None


def speedup_call(rng: dict | None) -> str:
    """A key of CALLS: a win or a loss only when the whole range is on one side of 1.0; touching 1.0 is noise."""
    if not rng:
        return "unranged"
    return "faster" if rng["min"] > 1.0 else "slower" if rng["max"] < 1.0 else "within noise"


def speedup_phrase(bench: dict, m: dict) -> str:
    """``1.49x (1.41-1.55 over 2 repeats)``; with one repeat the spread is over prompts, said so."""
    v, r = m["speedup_vs_plain"], speedup_range(bench, m)
    if r and r["of"] == "repeats":
        return f"{v:.2f}x ({r['min']:.2f}-{r['max']:.2f} over {r['n']} repeats)"
    if r:
        return (f"{v:.2f}x (1 repeat; per prompt {r['min']:.2f}-{r['max']:.2f}x, median {r['median']:.2f}x, "
                f"over {r['n']} prompts)")
    return f"{v:.2f}x (1 repeat)"


def on_engine(bench: dict, name: str) -> str:
    """What `name` is on an engine, in the shape the bench ran it (its depth, or its tree)."""
    shape = {"depth": "?", "top_k": "?", "tree_depth": "?", "total_tokens": "?", **(bench.get("config") or {})}
    return ON_ENGINE[name].format(**shape)


def headline(bench: dict) -> str:
    """The deployable method's speedup with its range and its call: the verdict's first words."""
    dep = deployed_method(bench)
    if not dep:
        return "no speedup measured (the bench ran no eaglewire_plain or no speculative method)"
    name, m = dep
    return f"{name} {_vs_plain(speedup_phrase(bench, m))}, {CALLS[speedup_call(speedup_range(bench, m))]}"


def engine_line(bench: dict) -> str | None:
    """What the headline's method is on an engine; a faster engine-less method only here, never in the headline."""
    dep = deployed_method(bench)
    if not dep:
        return None
    name, m = dep
    out = f"{name} is {on_engine(bench, name)}"
    best = best_method(bench)
    if best and best[0] != name and best[1]["speedup_vs_plain"] > m["speedup_vs_plain"]:
        out += f"; best measured here: {best[0]} {speedup_phrase(bench, best[1])}, {on_engine(bench, best[0])}"
    return out + "."


def _vs_plain(phrase: str) -> str:
    """``1.49x (...)`` -> ``1.49x vs eaglewire plain decoding (...)``: the baseline right after the number."""
    v, _, rest = phrase.partition(" ")
    return f"{v} vs eaglewire plain decoding" + (f" {rest}" if rest else "")


def outputs_phrase(bench: dict) -> str:
    """Every method's greedy output is compared with the first method's: all equal means all identical."""
    ms = bench.get("methods", {})
    n = bench.get("num_prompts", "?")
    differ = {k: m.get("differ_from_baseline") for k, m in ms.items()}
    if not ms or any(v is None for v in differ.values()):
        return "outputs not compared"
    if all(v == 0 for v in differ.values()):
        return f"outputs identical to transformers generate ({n} of {n} prompts, every method)"
    bad = ", ".join(f"{k} on {v}" for k, v in differ.items() if v)
    return f"OUTPUTS DIFFER from transformers generate: {bad} of {n} prompts"


def wiring_checks(doctor: dict) -> list[dict]:
    out = []
    for r in doctor.get("reports", []):
        names = WIRING.get(r["command"], set())
        out += [c for c in r["checks"] if r["command"] in WIRING and (names is None or c["name"] in names)]
    return out


def wiring_phrase(doctor: dict) -> str:
    checks = wiring_checks(doctor)
    if not checks:
        return "wiring not checked"
    bad = [c for c in checks if not c["ok"]]
    exports = sum(r["command"] == "config" for r in doctor.get("reports", []))
    if not bad:
        return f"wiring checks: all {len(checks)} PASS (dataset, drafter, {exports} exports)"
    return f"wiring checks: {len(bad)} of {len(checks)} NOT PASSED (see 'Doctor verdicts')"


def vllm_mean_length(m: dict, num_prompts: int) -> tuple[float, float] | None:
    """vLLM's mean acceptance length (1 + accepted per round that drafted) from a bench row, as (low, high).

    The bench's tau counts every verify round, rounds gated to no drafts
    among them; vLLM's count leaves those out. The row records tau, rounds
    and gated rounds but not the bonus tokens a stop cut (at most one per
    prompt), hence a range rather than one number.
    """
    steps, gated, tau = m.get("verify_steps"), m.get("rounds_without_drafts") or 0, m.get("tau")
    if not steps or tau is None or steps <= gated:
        return None
    drafted = steps - gated
    low = 1 + (tau - 1) * steps / drafted
    return low, low + min(num_prompts, drafted) / drafted


def fmt_span(lo: float, hi: float) -> str:
    """One figure when both ends print alike (never ``1.56-1.56``)."""
    a, b = f"{lo:.2f}", f"{hi:.2f}"
    return a if a == b else f"{a}-{b}"


def heldout_phrase(log: dict) -> str | None:
    """Acceptance on the held-out prompts as vLLM counts it, with its interval (the `heldout` stage)."""
    off = ((log.get("heldout") or {}).get("report") or {}).get("offline")
    if not off or not off.get("mean_acceptance_length"):
        return None
    ci = off.get("mean_acceptance_length_ci95")
    return (f"mean acceptance length {off['mean_acceptance_length']:.2f}" + (f" (95% {ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
            + f" on {off['samples']} held-out prompts (as vLLM counts it: 1 + accepted per round; chain depth "
            f"{off['depth']}, ungated)")


def _short(outputs: str, wiring: str) -> tuple[str, str]:
    """The headline's words for outputs and wiring; their detail (prompts, methods, what was checked) goes below."""
    out = outputs.split(" (", 1)[0].split(" from ", 1)[0].split(" to ", 1)[0]
    return out, wiring.split(" (", 1)[0].replace("wiring checks: ", "wiring: ")


def _detail(bench: dict, doctor: dict, outputs: str) -> str | None:
    """What the headline's outputs and wiring words rest on: the reference, the prompts, what was checked."""
    n, parts = bench.get("num_prompts", "?"), []
    if outputs.startswith("OUTPUTS DIFFER"):
        parts.append("differing from transformers generate: " + outputs.split(": ", 1)[1])
    elif outputs.startswith("outputs identical"):
        parts.append(f"compared with transformers generate on {n} of {n} prompts, every method")
    checks = wiring_checks(doctor)
    if checks and all(c["ok"] for c in checks):
        exports = sum(r["command"] == "config" for r in doctor.get("reports", []))
        parts.append(f"wiring checked on the dataset, the drafter and {exports} exports")
    elif checks:
        parts.append("failed wiring checks: see 'Doctor verdicts'")
    return (parts[0][0].upper() + "; ".join(parts)[1:] + ".") if parts else None


def verdict_lines(log: dict) -> list[str]:
    """The verdict a newcomer reads first: one headline (deployable speedup with its call, outputs, wiring),
    then at most three short lines with the rest (the method on an engine, what was compared, acceptance)."""
    bench, doctor = log.get("bench", {}), log.get("doctor", {})
    outputs, wiring = outputs_phrase(bench), wiring_phrase(doctor)
    out, wire = _short(outputs, wiring)
    lines = [f"Verdict: {headline(bench)}; {out}; {wire}."]
    if eng := engine_line(bench):
        lines.append(eng)
    if detail := _detail(bench, doctor, outputs):
        lines.append(detail)
    held = heldout_phrase(log)
    span = vllm_mean_length((bench.get("methods") or {}).get("eaglewire_chain") or {}, bench.get("num_prompts", 0))
    if held:
        lines.append(f"M{held[1:]}.")
    elif span:
        lines.append(f"Mean acceptance length {fmt_span(*span)} (as vLLM counts it: 1 + accepted per drafting "
                     f"round; chain depth {(bench.get('config') or {}).get('depth', '?')}).")
    return lines


def verdict_line(log: dict) -> str:
    """The verdict's headline alone (the report's bold line; `verdict_lines` has the rest)."""
    return verdict_lines(log)[0]


def verdict_tone(log: dict) -> str:
    """The verdict box's colour, read before its words: "bad" (red) when outputs differ or wiring failed,
    "good" (green) only when the deployable method is faster over its whole range, else "amber"."""
    bench = log.get("bench", {})
    if outputs_phrase(bench).startswith("OUTPUTS DIFFER") or "NOT PASSED" in wiring_phrase(log.get("doctor", {})):
        return "bad"
    dep = deployed_method(bench)
    return "good" if dep and speedup_call(speedup_range(bench, dep[1])) == "faster" else "amber"


def round_cost(bench: dict, method: str) -> dict | None:
    """A drafting round of `method` in plain decode steps, from the bench's own time split."""
    ms = bench.get("methods", {})
    m, plain = ms.get(method) or {}, ms.get("eaglewire_plain") or {}
    t, steps = m.get("time_s") or {}, m.get("verify_steps")
    if not (t and steps and plain.get("tokens") and plain.get("seconds")):
        return None
    plain_ms = 1000 * plain["seconds"] / plain["tokens"]
    verify_ms, draft_ms = 1000 * t["verify"] / steps, 1000 * t["draft"] / steps
    return {"plain_ms": plain_ms, "verify_ms": verify_ms, "draft_ms": draft_ms, "ratio": (verify_ms + draft_ms) / plain_ms}


def caveats(log: dict, run, p: dict) -> list[str]:
    """Why the verdict's speedup may not hold up, each from a figure of this run, with the command to firm it up."""
    bench = log.get("bench", {})
    dep = deployed_method(bench)
    out = []
    ratio = bench.get("plain_vs_hf_generate")
    if ratio is not None and ratio < 0.8:
        out.append(f"eaglewire plain decoding ran at {ratio:.2f}x transformers generate here (about 1x on a quiet "
                   "machine, measured in docs/results.md): the machine was likely busy, so the timings are noisy.")
    if dep:
        out += _method_caveats(bench, *dep)
    if out and bench.get("repeats", 1) < 3:
        out.append(f"To firm it up: `eaglewire bench --drafter {run}/train/drafter --max-prompts "
                   f"{p.get('bench_prompts', 9)} --max-new-tokens {p.get('bench_tokens', 64)} --repeats 3 "
                   f"--out {run}/bench-repeats` on an otherwise idle machine.")
    return out


def _method_caveats(bench: dict, name: str, m: dict) -> list[str]:
    """The headline method's own: a range across 1.0, a total a few prompts carry, a round that cost more than it gave."""
    out = []
    rng = speedup_range(bench, m)
    if speedup_call(rng) == "within noise":
        out.append(f"{name}'s range ({rng['min']:.2f}-{rng['max']:.2f}x over {rng['n']} {rng['of']}) crosses 1.0: "
                   "this run cannot tell it from plain decoding.")
    pp = m.get("speedup_vs_plain_per_prompt") or {}
    if pp.get("n", 1) > 1 and pp["median"] < 1 and m["speedup_vs_plain"] >= CLEAR_GAIN:
        out.append(f"The median prompt ran slower than plain decoding ({pp['median']:.2f}x): the total is carried "
                   "by a few prompts.")
    cost = round_cost(bench, name)
    if cost and m.get("speedup_vs_plain", 1) < 1:
        out.append(f"Speculation ran slower than plain decoding because a drafting round cost {cost['ratio']:.2f} plain "
                   f"decode steps here (verify {cost['verify_ms']:.0f} ms + draft {cost['draft_ms']:.0f} ms against "
                   f"{cost['plain_ms']:.0f} ms), more than the {m['tau']:.2f} tokens a round gave. On a "
                   "GPU a verify of a few tokens costs about one decode step (docs/results.md, 'Why the speedup trails tau').")
    return out


def demote(report: dict) -> dict:
    """Turn the warnings in DEMO_INFO into informational passes (in place), keeping why."""
    for c in report.get("checks", []):
        why = DEMO_INFO.get((report.get("command"), c["name"]))
        if why and not c["ok"] and c["level"] == "warning":
            c.update(ok=True, level="info", informational=why)
    return report


def doctor_labels(reports: list[dict]) -> list[str]:
    """Each report's name in the table: an export check names its engine, else the sglang and vllm rows read alike.

    A marker written before the demo recorded the engine gets it from the order
    the demo checks the exports in (deploy.FORMATS).
    """
    labels, k = [], 0
    for r in reports:
        if r["command"] == "config":
            labels.append(f"config ({r.get('engine') or (FORMATS[k] if k < len(FORMATS) else '?')} export)")
            k += 1
        else:
            labels.append(r["command"])
    return labels


def doctor_rows(doc: dict) -> list[list[str]]:
    """Verdict rows; a WARN carries its fix, and a warning the demo's user cannot act on is INFO."""
    rows = []
    reports = doc.get("reports", [])
    for label, r in zip(doctor_labels(reports), reports):
        for c in demote(copy.deepcopy(r))["checks"]:
            detail = c["detail"]
            if c.get("informational"):
                mark, detail = "INFO", f"{detail} (informational here: {c['informational']})"
            elif c["ok"]:
                mark = "PASS"
            else:
                mark = "WARN" if c["level"] == "warning" else "FAIL"
                detail += f"; fix: {c['fix']}" if c.get("fix") else ""
            rows.append([label, c["name"], mark, detail])
    return rows
