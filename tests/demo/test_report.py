"""The demo report renders for a person: headless Chromium screenshot shows the plots and tables."""

import json
import re
import shutil
import subprocess

import pytest

from eaglewire_testing.ci import cannot_run
from eaglewire_testing.demo_data import STAGE_SECONDS, synthetic_bench

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_markdown_and_html_content(make_run):
    run = make_run()
    md = (run / "report.md").read_text()
    html = (run / "report.html").read_text()
    assert "SMALL run" in md and "eaglewire_tree" in md and "--format vllm" in md
    prov = json.loads((run / "train" / "drafter" / "eaglewire.json").read_text())
    assert str(prov["points"]["vllm"]) in md and str(prov["points"]["sglang"]) in md
    assert html.count("data:image/png;base64") == 2 and "<table>" in html
    assert (run / "speed.png").stat().st_size > 5_000 and (run / "training.png").stat().st_size > 5_000


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_html_renders_code_spans_and_markdown_keeps_them(make_run):
    run = make_run()
    md, html = (run / "report.md").read_text(), (run / "report.html").read_text()
    assert "| offline chain tau (`doctor drafter`) |" in md
    assert "<td>offline chain tau (<code>doctor drafter</code>)</td>" in html
    cells = re.findall(r"<t[dh]>(.*?)</t[dh]>", html)
    assert len(cells) > 50 and not [c for c in cells if "`" in c]
    assert "`" not in html  # nor in the verdict, the notes or the lists


def test_category_speedups_say_how_many_prompts_they_rest_on(make_run):
    md = (make_run()).joinpath("report.md").read_text()
    sec = _section(md, "Per category (held-out prompts; n = prompts per figure)")
    chain = synthetic_bench()["methods"]["eaglewire_chain"]["speedup_vs_plain"]  # math: prompt 0 (x0.9)
    math = next(r for r in sec.splitlines() if r.startswith("| math |"))
    assert math.startswith(f"| math | 1 | 1.50 | {chain * 0.9:.2f}x (n=1) | 1.70 | ")
    writing = next(r for r in sec.splitlines() if r.startswith("| writing |"))
    assert f"| {chain * 1.1:.2f}x (n=2) |" in writing
    assert "1 of 2 categories rest on one prompt (n=1)" in sec and "rest on all 3 prompts" in sec


def test_run_section_has_no_json_and_a_stage_table_with_the_total(make_run):
    md = (make_run()).joinpath("report.md").read_text()
    run = _section(md, "Run")
    assert "{" not in run and '"' not in run
    assert "| settings | topic_prompts 320, bench_prompts 3, bench_tokens 64 |" in run
    assert "| dataset | 320 samples, 50000 tokens; draft vocab 200 tokens, covering 97.3% of the answer tokens |" in run
    stages = _section(md, "Wall time per stage")
    assert [r for r in stages.splitlines() if r.startswith("| ") and "stage" not in r] == [
        "| data | 330 s (5.5 min) |", "| train | 240 s (4.0 min) |", "| doctor | 12 s (0.2 min) |",
        "| bench | 114 s (1.9 min) |", "| total | 696 s (11.6 min) |"]
    assert sum(STAGE_SECONDS.values()) == 696


@pytest.mark.integration  # a real browser renders the report
def test_report_renders_in_headless_chromium(make_run, tmp_path):
    from PIL import Image

    if CHROMIUM is None:
        cannot_run("Debian's chromium is not installed (.ci/run installs it)")

    run = make_run()
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2400", f"--screenshot={shot}",
           (run / "report.html").resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    px = list(Image.open(shot).convert("RGB").get_flattened_data())
    colored = sum(1 for r, g, b in px if max(r, g, b) - min(r, g, b) > 60)  # plot lines and bars
    dark = sum(1 for r, g, b in px if r + g + b < 200)  # table text
    assert colored > 20_000, f"plots did not render ({colored} colored pixels)"
    assert dark > 5_000, f"text/tables did not render ({dark} dark pixels)"


def test_offline_vs_serving_row_only_compares_like_with_like():
    """A chain benched with --min-prob counts gated rounds as tau 1: the row must not call it an error."""
    from eaglewire.demo.acceptance import prediction_row, tau_relation

    off = {"command": "drafter", "offline": {"depth": 4, "tau_chain": 1.5, "acc": [0.4]}, "split": "val"}
    log = {"doctor": {"reports": [off]}, "bench": {"methods": {"eaglewire_chain": {"tau": 1.25}},
                                                   "config": {"min_prob": 0.0}}}
    assert prediction_row(log)[3:5] == ["1.25", "offline error +20.0%"]
    log["bench"]["config"]["min_prob"] = 0.1
    row = prediction_row(log)
    assert row[3] == "1.25 (with --min-prob 0.1)" and "not comparable" in row[4]
    assert row[0] == "chain tau, chain depth 4"  # an older run: only the every-position figure
    off["offline"].update(mean_acceptance_length=1.4, depth=3)
    log["bench"]["config"].update(min_prob=0.0, depth=4)
    row = prediction_row(log)
    assert row[:2] == ["mean acceptance length, chain depth 3", "1.40"] and row[4] == "offline error +12.0%"
    assert "(ungated, depth 3)" in tau_relation(log)  # the offline figure's depth, not bench's


def test_demo_doctor_checks_the_exports_without_a_warning(tiny_drafter, tmp_path):
    """The demo's happy path checks what a user deploys (the exports, with the training config):
    no WARN row a user cannot act on, and the SGLang ids need no version warning."""
    import shutil

    from eaglewire.demo.commands import demo_steps
    from eaglewire.demo.config import PRESETS, DemoConfig
    from eaglewire.demo.run import _doctor

    ckpt, data = tiny_drafter
    run = tmp_path / "run"
    shutil.copytree(ckpt, run / "train" / "drafter")
    (run / "data").symlink_to(data)
    steps = demo_steps("tiny:llama", PRESETS["quick"], run)
    reps = _doctor(DemoConfig(target="tiny:llama"), steps)["reports"]
    configs = [r for r in reps if r["command"] == "config"]
    assert len(configs) == 2 and (run / "export" / "sglang" / "config.json").is_file()
    assert [r["engine"] for r in configs] == ["sglang", "vllm"]  # the report names each row's engine
    assert [r["command"] for r in reps] == ["dataset", "drafter", "config", "config"]
    for r in reps:  # every row of the happy path: dataset, drafter and both exports
        bad = [c for c in r["checks"] if not c["ok"]]
        assert bad == [], (r["command"], bad)
    demoted = [c for r in reps for c in r["checks"] if c.get("informational")]
    assert all(c["name"] == "sample size" for c in demoted)  # the preset fixes the split: INFO, not WARN
    for r in configs:  # the training config was found (in the export's own record), so it was checked
        assert any(c["name"] == "rope / norm" and "match training" in c["detail"] for c in r["checks"])


def test_where_the_time_goes_splits_each_round_against_a_plain_step(make_run):
    from eaglewire_testing.demo_data import DRAFT_S, VERIFY_S

    md = (make_run()).joinpath("report.md").read_text()
    sec = _section(md, "Where the time goes (per verify round, from the bench's own timers)")
    bench = synthetic_bench()
    plain_ms = 1000 / bench["methods"]["eaglewire_plain"]["tokens_per_s"]
    chain = next(r for r in sec.splitlines() if r.startswith("| eaglewire_chain |"))
    ratio = (DRAFT_S + VERIFY_S) * 1000 / plain_ms
    tau = bench["methods"]["eaglewire_chain"]["tau"]
    assert chain == (f"| eaglewire_chain | {plain_ms:.1f} | {DRAFT_S * 1000:.1f} | {VERIFY_S * 1000:.1f} | "
                     f"{ratio:.2f} | {tau:.2f} | {tau / ratio:.2f}x |")
    assert "eaglewire_plain |" not in sec and "hf_generate |" not in sec


@pytest.mark.parametrize("gated", [False, True])
def test_llamacpp_section_has_the_measured_rows(make_run, gated):
    from eaglewire_testing.demo_data import synthetic_log

    log = synthetic_log()
    log["llamacpp"] = {"depth": 2, "drafter_type": "q8_0", "target_gguf": "/c/t-f32.gguf", "prompts": 9,
                       "max_new_tokens": 64, "rounds": 300, "mean_acceptance_length": 1.4, "outputs_equal_plain": 8,
                       "export": "RUN/export/llama.cpp", "ids": [2, 15, 27],
                       "tokens_per_s": {"llama.cpp plain": 20.0, "llama.cpp + drafter": 26.0, "eaglewire plain": 10.0}}
    if gated:  # the stage as it runs now: llama.cpp's draft gate, and eaglewire's prediction of it
        log["llamacpp"].update(p_min=0.5, predicted_mean_acceptance_length=1.41)
    md = (make_run(log) / "report.md").read_text()
    sec = md.split("## llama.cpp, the CPU engine people run")[1].split("\n## ")[0]
    row = ("| llama.cpp + drafter (depth 2, p-min 0.5, q8_0 GGUF) | 26.0 | 1.30x | 1.40 over 300 rounds "
           "(eaglewire predicts 1.41) | 8 of 9 |" if gated else
           "| llama.cpp + drafter (depth 2, q8_0 GGUF) | 26.0 | 1.30x | 1.40 over 300 rounds | 8 of 9 |")
    assert row in sec
    assert "| eaglewire plain | 10.0 | 0.50x | - | - |" in sec
    assert "eagle3.target_layers [2, 15, 27]" in sec


def test_llamacpp_section_says_why_it_was_not_measured(make_run):
    from eaglewire_testing.demo_data import synthetic_log

    log = synthetic_log()
    log["llamacpp"] = {"skipped": "no llama-server built here"}
    md = (make_run(log) / "report.md").read_text()
    assert "Not measured: no llama-server built here." in md.split("## llama.cpp, the CPU engine people run")[1]
