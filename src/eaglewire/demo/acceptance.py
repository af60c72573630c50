"""The report's acceptance section: tau and the mean acceptance length, each row labelled with what it counts.

`doctor drafter`, `doctor online` and `bench` all report "1 + accepted drafts
per round", but over different rounds (every answer position, or the rounds
decoding takes), different gating and different prompts; side by side without
labels they look like three disagreeing answers to one question.
"""

from __future__ import annotations

from eaglewire.demo.findings import SPEC, fmt_span, vllm_mean_length
from eaglewire.saved.depth import DEPTH


def _report(log: dict, command: str) -> dict | None:
    return next((r for r in log.get("doctor", {}).get("reports", []) if r.get("command") == command), None)


def _offline_rows(log: dict) -> list[list[str]]:
    r = _report(log, "drafter")
    off = (r or {}).get("offline")
    if not off:
        return []
    on = f"{r.get('split', '-')}: answers to composed prompts like the training ones"
    rows = [["offline chain tau (`doctor drafter`)", f"{off['tau_chain']:.2f}",
             f"a round started at EVERY answer position, chain depth {off['depth']}, ungated, drafter fed the "
             "target's stored features (teacher-forced)", on]]
    if off.get("mean_acceptance_length"):
        ci = off.get("mean_acceptance_length_ci95")
        rows.append(["offline mean acceptance length (`doctor drafter`)",
                     f"{off['mean_acceptance_length']:.2f}" + (f" (95% {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""),
                     f"the rounds greedy decoding would take (vLLM's count), chain depth {off['depth']}, ungated", on])
    return rows


def _online_row(log: dict, run) -> list[str]:
    r = _report(log, "online")
    what = (f"our engine decoding the dataset's prompts, chain depth {(r or {}).get('depth', DEPTH)}, --min-prob 0, "
            "drafter fed the engine's own features")
    if r and r.get("online_tau") is not None:
        return ["online chain tau (`doctor online`)", f"{r['online_tau']:.2f}", what, "the first dataset samples (training data)"]
    return ["online chain tau (`doctor online`)", "not run by the demo", what,
            f"`eaglewire doctor online --drafter {run}/train/drafter --data {run}/data`"]


def _bench_rows(bench: dict) -> list[list[str]]:
    ms = bench.get("methods", {})
    spec = [n for n in SPEC if (ms.get(n) or {}).get("tau")]
    if not spec:
        return []
    c = bench.get("config") or {}
    gate, on = c.get("min_prob") or 0.0, f"{bench.get('num_prompts', '?')} held-out hand-written prompts"
    gated = ", ".join(f"{n.removeprefix('eaglewire_')} {ms[n].get('rounds_without_drafts', 0)} of "
                      f"{ms[n].get('verify_steps', '?')}" for n in spec)
    how = (f"every verify round; rounds --min-prob {gate} left without drafts ({gated}) count as 1" if gate
           else "every verify round, ungated")
    rows = [["serving tau (`bench`)", ", ".join(f"{n.removeprefix('eaglewire_')} {ms[n]['tau']:.2f}" for n in spec),
             f"{how}; chain depth {c.get('depth', '?')}, tree top_k {c.get('top_k', '?')} / depth "
             f"{c.get('tree_depth', '?')} / {c.get('total_tokens', '?')} tokens", on]]
    span = vllm_mean_length(ms.get("eaglewire_chain") or {}, bench.get("num_prompts", 0))
    if span:
        rows.append(["serving mean acceptance length (`bench` chain)", fmt_span(*span),
                     "vLLM's count: the chain's rounds that drafted only (a range: the bench does not record the "
                     "bonus tokens a stop cut)", on])
    return rows


def _heldout_rows(log: dict) -> list[list[str]]:
    r = (log.get("heldout") or {}).get("report") or {}
    off = r.get("offline")
    if not off or not off.get("mean_acceptance_length"):
        return []
    ci = off.get("mean_acceptance_length_ci95")
    pos = " / ".join(f"{a:.2f}" for a in off.get("acceptance_rate_per_position", []))
    cats = ", ".join(f"{c} {v['mean_acceptance_length']:.2f}" for c, v in
                     sorted((r.get("per_category") or {}).items(), key=lambda kv: -kv[1]["mean_acceptance_length"]))
    return [["held-out mean acceptance length (`doctor drafter --data heldout`)",
             f"{off['mean_acceptance_length']:.2f}" + (f" (95% {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""),
             f"vLLM's count on the rounds greedy decoding takes, chain depth {off['depth']}, ungated; accepted per "
             f"position {pos}" + (f"; per category {cats}" if cats else ""),
             f"the target's answers to the {off['samples']} shipped held-out prompts (never trained on)"]]


def tau_rows(log: dict, run) -> list[list[str]]:
    return _heldout_rows(log) + _offline_rows(log) + [_online_row(log, run)] + _bench_rows(log.get("bench", {}))


def tau_relation(log: dict) -> str:
    """One sentence on how the taus relate, with this run's depth and gate."""
    c = log.get("bench", {}).get("config") or {}
    gate = c.get("min_prob") or 0.0
    depth = ((_report(log, "drafter") or {}).get("offline") or {}).get("depth", DEPTH)
    return ("How they relate: all count 1 + accepted drafts per round. The offline chain tau starts a round at every "
            f"answer position (ungated, depth {depth}), so it weighs the easy stretches that decoding "
            "skips over and reads highest; the mean acceptance lengths and `doctor online` count the rounds decoding "
            "takes; "
            + (f"bench's tau is gated by --min-prob {gate}: a round with no draft above the threshold counts as tau 1, "
               "so it reads lower than an ungated chain"
               if gate else "bench's tau here is ungated, like the offline ones")
            + ", and it runs on hand-written prompts unlike the training ones.")


def prediction_row(log: dict) -> list[str] | None:
    """The offline mean acceptance length (decoding's rounds) vs bench's chain tau, compared only when both are ungated."""
    r = _report(log, "drafter")
    off = (r or {}).get("offline")
    if not off:
        return None
    bench = log.get("bench", {})
    serve = (bench.get("methods", {}).get("eaglewire_chain") or {}).get("tau")
    gated = (bench.get("config") or {}).get("min_prob") or 0.0
    # older runs recorded only the every-position figure
    what = "mean acceptance length" if off.get("mean_acceptance_length") else "chain tau"
    pred = off.get("mean_acceptance_length") or off["tau_chain"]
    err = f"offline error {(pred - serve) / serve:+.1%}" if serve else "bench ran no chain"
    shown = f"{serve:.2f}" if serve else "-"
    if serve and gated:  # gated rounds count tau 1: not the ungated chain the offline tau describes
        shown += f" (with --min-prob {gated})"
        err = ("not comparable (gated rounds count tau 1): `eaglewire bench ... --methods eaglewire_chain --min-prob 0` "
               "gives the ungated chain")
    return [f"{what}, chain depth {off['depth']}", f"{pred:.2f}", r.get("split", "-"), shown, err,
            " ".join(f"{a:.3f}" for a in off["acc"])]
