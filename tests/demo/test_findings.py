"""What the demo report tells a newcomer, checked against made-up runs (src/eaglewire_testing/demo_data.py).

The verdict comes first and follows from the data; its headline is the method
a deployment runs (the chain), fixed before the run, with its range; the
chart has one baseline; a happy path shows no WARN; every deployment check
names a directory of the run.
"""

import re
import shlex

from eaglewire.decoding.bench import _median, plot_speed
from eaglewire.demo.acceptance import tau_rows
from eaglewire.demo.findings import (
    caveats,
    doctor_rows,
    fmt_span,
    round_cost,
    verdict_line,
    verdict_lines,
    verdict_tone,
)
from eaglewire.engines.sglang import launch_command
from eaglewire_testing.demo_data import TPS, check, synthetic_bench, synthetic_log

CHAIN = "eaglewire_chain is what vLLM runs, num_speculative_tokens 4 = chain depth 4"


def _expected_speedup(name: str) -> tuple[float, float, float]:
    r = [a / b for a, b in zip(TPS[name], TPS["eaglewire_plain"])]
    return _median(r), min(r), max(r)


def _headline(line: str) -> str:
    """The verdict's speedup and its call, i.e. the headline before its outputs and wiring words."""
    return re.split("; (?:outputs|OUTPUTS) ", line, maxsplit=1)[0]


def test_verdict_is_computed_from_the_stages():
    v, lo, hi = _expected_speedup("eaglewire_chain")
    lines = verdict_lines(synthetic_log())
    assert lines[0] == (f"Verdict: eaglewire_chain {v:.2f}x vs eaglewire plain decoding ({lo:.2f}-{hi:.2f} over 2 "
                        "repeats), faster over its whole range; outputs identical; wiring: all 10 PASS.")
    assert lines[0] == verdict_line(synthetic_log())
    assert lines[1].startswith(CHAIN)
    assert lines[2] == ("Compared with transformers generate on 3 of 3 prompts, every method; wiring checked on the "
                        "dataset, the drafter and 2 exports.")
    # vLLM's count from bench's chain: tau 1.5 over 400 rounds, 40 of them gated (tau 1): 1.556-1.564, one figure
    assert lines[3].startswith("Mean acceptance length 1.56 (as vLLM counts it")


def test_the_verdict_reads_at_a_glance():
    """A headline of a few words, then at most three short lines: every fact kept, the words cut."""
    for log in (synthetic_log(), synthetic_log(synthetic_bench(repeats=1, differ={"eaglewire_tree": 2}),
                                               drafter_checks=[check("points", ok=False, level="error")])):
        lines = verdict_lines(log)
        assert len(lines[0].split()) <= 35 and 1 <= len(lines) - 1 <= 3
        assert all(len(x.split()) <= 40 for x in lines[1:]) and not any("\n" in x for x in lines)


def test_the_headline_is_the_chain_even_when_tree_lookup_is_faster():
    v, _, _ = _expected_speedup("eaglewire_chain")
    best, lo, hi = _expected_speedup("eaglewire_tree_lookup")
    assert best > v + 0.3  # the made-up run's fastest method is the engine-less lookup branch
    lines = verdict_lines(synthetic_log())
    assert _headline(lines[0]) == (f"Verdict: eaglewire_chain {v:.2f}x vs eaglewire plain decoding (1.10-1.20 over 2 "
                                   "repeats), faster over its whole range")
    assert "lookup" not in lines[0]
    assert lines[1] == (f"{CHAIN}; best measured here: eaglewire_tree_lookup {best:.2f}x ({lo:.2f}-{hi:.2f} over 2 "
                        "repeats), not deployable on an engine: the lookup branch has no engine flag.")


def test_a_range_across_one_is_within_noise_and_drawn_amber():
    log = synthetic_log(synthetic_bench(repeats=1))  # one repeat: chain 1.10x, per prompt 0.99-1.32x
    head = _headline(verdict_line(log))
    assert head == ("Verdict: eaglewire_chain 1.10x vs eaglewire plain decoding (1 repeat; per prompt 0.99-1.32x, "
                    "median 1.10x, over 3 prompts), within noise (the range crosses 1.0)")
    assert verdict_tone(log) == "amber"  # although the lookup branch's whole range (1.27-1.69x) is above 1.0
    notes = caveats(log, "RUN", {"bench_prompts": 3})
    assert notes[0] == ("eaglewire_chain's range (0.99-1.32x over 3 prompts) crosses 1.0: this run cannot tell it "
                        "from plain decoding.")
    assert notes[1].startswith("To firm it up: `eaglewire bench --drafter RUN/train/drafter --max-prompts 3 ")
    over_repeats = synthetic_log(synthetic_bench(tps={"eaglewire_chain": [9.6, 10.4]}))
    assert _headline(verdict_line(over_repeats)).endswith("1.00x vs eaglewire plain decoding (0.96-1.04 over 2 "
                                                          "repeats), within noise (the range crosses 1.0)")
    assert verdict_tone(over_repeats) == "amber"


def test_a_chain_slower_over_its_whole_range_is_a_loss_drawn_amber():
    log = synthetic_log(synthetic_bench(tps={"eaglewire_chain": [9.0, 9.4]}))
    assert _headline(verdict_line(log)).endswith("0.92x vs eaglewire plain decoding (0.90-0.94 over 2 repeats), "
                                                 "slower over its whole range")
    assert verdict_tone(log) == "amber"
    assert verdict_tone(synthetic_log()) == "good"  # the chain's whole range (1.10-1.20) above 1.0


def test_without_a_chain_the_headline_falls_back_to_the_tree_with_its_shape():
    bench = synthetic_bench()
    del bench["methods"]["eaglewire_chain"]
    lines = verdict_lines(synthetic_log(bench))
    assert lines[0].startswith("Verdict: eaglewire_tree 1.28x vs eaglewire plain decoding (1.26-1.30 over 2 "
                               "repeats), faster")
    assert lines[1].startswith("eaglewire_tree is what SGLang runs, tree top_k 3 / depth 2 / 7 tokens; ")
    del bench["methods"]["eaglewire_tree"]
    lines = verdict_lines(synthetic_log(bench))
    assert lines[0].startswith("Verdict: eaglewire_tree_lookup 1.48x")
    assert lines[1] == ("eaglewire_tree_lookup is not deployable on an engine: the lookup branch has no engine flag.")
    del bench["methods"]["eaglewire_tree_lookup"]
    log = synthetic_log(bench)
    assert verdict_line(log).startswith("Verdict: no speedup measured") and verdict_tone(log) == "amber"


def test_one_figure_when_both_ends_of_a_span_print_alike():
    assert fmt_span(1.5556, 1.5639) == "1.56" and fmt_span(1.231, 1.279) == "1.23-1.28"


def test_verdict_says_when_outputs_differ_or_wiring_fails_and_uses_prompts_for_one_repeat():
    log = synthetic_log(synthetic_bench(repeats=1, differ={"eaglewire_tree": 2}),
                        drafter_checks=[check("points", ok=False, level="error", fix="recapture")])
    lines = verdict_lines(log)
    r = TPS["eaglewire_chain"][0] / TPS["eaglewire_plain"][0]  # the one repeat's ratio
    assert f"{r:.2f}x vs eaglewire plain decoding (1 repeat; per prompt {r * 0.9:.2f}-{r * 1.2:.2f}x, " \
           f"median {r:.2f}x, over 3 prompts)" in lines[0]
    assert lines[0].endswith("; OUTPUTS DIFFER; wiring: 1 of 9 NOT PASSED.")
    assert lines[2] == ("Differing from transformers generate: eaglewire_tree on 2 of 3 prompts; failed wiring "
                        "checks: see 'Doctor verdicts'.")
    assert not any("identical" in x for x in lines)
    assert verdict_tone(log) == "bad"


def test_verdict_is_the_first_line_of_the_report(make_run):
    run = make_run()
    body = [x for x in (run / "report.md").read_text().splitlines()[1:] if x.strip()]
    lines = verdict_lines(synthetic_log())
    assert body[:len(lines)] == [f"**{lines[0]}**", *(f"- {x}" for x in lines[1:])]
    html = (run / "report.html").read_text()
    assert html.index('class="verdict"') < html.index("<img")
    assert html.count("<br>", html.index('class="verdict"'), html.index("</p>", html.index('class="verdict"'))) == 3


def test_speed_chart_has_one_baseline_with_error_bars(tmp_path):
    bench = synthetic_bench(repeats=2)
    s = plot_speed(bench, tmp_path / "speed.png")
    assert (tmp_path / "speed.png").stat().st_size > 5_000
    assert s["baseline"] == "eaglewire_plain"
    assert s["speedup_methods"] == ["eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup"]
    assert not any(m.startswith("hf_") for m in s["speedup_methods"] + s["tps_methods"])  # generate: table only
    for name, v, (below, above) in zip(s["speedup_methods"], s["speedup_vs_plain"], s["speedup_range"]):
        med, lo, hi = _expected_speedup(name)
        assert (v, v - below, v + above) == (med, lo, hi)
    one = plot_speed(synthetic_bench(repeats=1), tmp_path / "one.png")  # one repeat: the spread over prompts
    assert one["spread_of"] == "3 prompts" and all(b > 0 and a > 0 for b, a in one["speedup_range"])


def test_happy_path_has_no_warn_and_a_warning_carries_its_fix(make_run):
    md = (make_run()).joinpath("report.md").read_text()
    assert "| WARN |" not in md and "| FAIL |" not in md
    rows = doctor_rows({"reports": [{"command": "drafter", "checks": [
        check("sample size", ok=False, level="warning", fix="more samples"),
        check("offline acceptance", ok=False, level="warning", fix="train longer")]}]})
    assert rows[0][2] == "INFO" and "informational here" in rows[0][3]  # the demo's preset fixes the split
    assert rows[1][2] == "WARN" and rows[1][3].endswith("fix: train longer")


def test_a_bad_verdict_is_not_drawn_green(make_run):
    run = make_run(synthetic_log(synthetic_bench(differ={"eaglewire_tree": 1})))
    assert 'class="verdict bad"' in (run / "report.html").read_text()


def test_the_box_follows_the_deployable_method_not_the_fastest(make_run):
    run = make_run(synthetic_log(synthetic_bench(repeats=1)))  # chain within noise, tree_lookup above 1.0
    html = (run / "report.html").read_text()
    assert '<p class="verdict slow"><b>Verdict: eaglewire_chain 1.10x' in html


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_deployment_commands_name_directories_the_run_has(make_run):
    run = make_run()
    md = (run / "report.md").read_text()
    rows = [r for r in _section(md, "Export, serve and check a deployment").splitlines() if "Check a deployment" in r]
    assert len(rows) == 2
    for r in rows:
        paths = [w for w in r.split() if w.startswith(str(run))]
        assert paths and all((run / p[len(str(run)) + 1:]).is_dir() for p in paths), r
    serve = _section(md, "Export, serve and check a deployment")
    c = synthetic_bench()["config"]  # the flags are the benchmarked chain, the shape `serve` starts
    assert (f"--speculative-num-steps {c['depth']} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {c['depth'] + 1}") in serve
    assert f'"num_speculative_tokens": {c["depth"]}' in serve
    assert "How to get more" in md and _section(md, "How to get more").strip()


def test_the_reports_sglang_flags_are_what_serve_starts(make_run):
    """One tree shape everywhere: the report's SGLang line is `launch_command`'s for the benchmarked chain."""
    run = make_run()
    row = next(r for r in _section((run / "report.md").read_text(), "Export, serve and check a deployment")
               .splitlines() if "Serve with SGLang" in r)
    words = shlex.split(row.split("|")[2].strip().strip("`"))
    depth = synthetic_bench()["config"]["depth"]
    assert words == launch_command("<target>", f"{run}/export/sglang", depth)
    assert words[words.index("--speculative-eagle-topk") + 1] == "1"


def test_no_check_command_for_an_export_the_run_lacks(make_run):
    md = (make_run(exports=("vllm",))).joinpath("report.md").read_text()
    sec = _section(md, "Export, serve and check a deployment").splitlines()
    checks = [r for r in sec if "Check a deployment" in r]
    assert len(checks) == 1 and "export/vllm --engine vllm" in checks[0]
    assert any("Export for sglang" in r and "(not made in this run)" in r for r in sec)


def test_the_acceptance_rows_are_labelled(make_run):
    md = (make_run()).joinpath("report.md").read_text()
    sec = _section(md, "Acceptance (tau and mean acceptance length, incl. the bonus token): what each row counts")
    for label in ("offline chain tau (`doctor drafter`)", "online chain tau (`doctor online`)", "serving tau (`bench`)"):
        assert label in sec
    assert "EVERY answer position" in sec and "count as 1" in sec and "How they relate" in sec


def test_verdict_prefers_the_heldout_acceptance_with_its_interval():
    """The held-out stage's figure (ungated, the rounds decoding takes) replaces bench's gated estimate."""
    log = synthetic_log()
    off = {"mean_acceptance_length": 1.4234, "mean_acceptance_length_ci95": [1.351, 1.502], "samples": 54, "depth": 3,
           "acceptance_rate_per_position": [0.3, 0.09, 0.03]}
    log["heldout"] = {"report": {"command": "drafter", "offline": off,
                                 "per_category": {"math": {"mean_acceptance_length": 1.6}, "writing": {"mean_acceptance_length": 1.3}}}}
    line = verdict_lines(log)[-1]
    assert line.startswith("Mean acceptance length 1.42 (95% 1.35-1.50) on 54 held-out prompts") and "chain depth 3, ungated" in line
    row = tau_rows(log, "RUN")[0]
    assert row[1] == "1.42 (95% 1.35-1.50)" and "0.30 / 0.09 / 0.03" in row[2] and "math 1.60, writing 1.30" in row[2]


def test_a_slower_than_plain_run_says_what_a_round_cost():
    bench = {"repeats": 3, "methods": {
        "eaglewire_plain": {"tokens": 500, "seconds": 20.0, "tokens_per_s": 25.0, "speedup_vs_plain": 1.0},
        "eaglewire_tree": {"tokens": 500, "seconds": 22.0, "tokens_per_s": 22.7, "speedup_vs_plain": 0.91, "tau": 1.45,
                           "verify_steps": 345, "time_s": {"verify": 20.7, "draft": 1.38, "prefill": 0.9}}}}
    c = round_cost(bench, "eaglewire_tree")
    assert abs(c["plain_ms"] - 40.0) < 1e-9 and abs(c["verify_ms"] - 60.0) < 1e-9 and abs(c["draft_ms"] - 4.0) < 1e-9
    assert abs(c["ratio"] - 1.6) < 1e-9
    notes = caveats({"bench": bench}, "RUN", {})
    assert any("a drafting round cost 1.60 plain decode steps" in n and "1.45 tokens" in n for n in notes), notes
    bench["methods"]["eaglewire_tree"]["speedup_vs_plain"] = 1.2  # faster than plain: nothing to explain
    assert not any("drafting round cost" in n for n in caveats({"bench": bench}, "RUN", {}))


def test_export_checks_name_their_engine_in_the_doctor_table():
    labels = {r[0] for r in doctor_rows(synthetic_log()["doctor"])}
    assert labels == {"dataset", "drafter", "config (sglang export)", "config (vllm export)"}
    old = synthetic_log()["doctor"]  # a marker from before the engine was recorded: the demo's export order
    for r in old["reports"]:
        r.pop("engine", None)
    assert [r[0] for r in doctor_rows(old) if r[0].startswith("config")][::3] == ["config (sglang export)",
                                                                                  "config (vllm export)"]
