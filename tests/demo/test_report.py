"""The demo report renders for a person: headless Chromium screenshot shows the plots and tables."""

import json
import shutil
import subprocess
from pathlib import Path

from eaglewire.demo.report import write_report
from support.ci import cannot_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _fake_bench(run: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = {"hf_generate": {"tokens_per_s": 9.0, "speedup": 1.0, "differ_from_baseline": 0},
               "eaglewire_tree": {"tokens_per_s": 20.0, "speedup": 2.2, "tau": 3.1, "differ_from_baseline": 0,
                                  "accept_per_position": {"cumulative": [0.8, 0.6, 0.4]}}}
    fig, ax = plt.subplots()
    ax.bar(list(methods), [m["tokens_per_s"] for m in methods.values()], color="tab:orange")
    png = run / "bench" / "speed.png"
    png.parent.mkdir(parents=True)
    fig.savefig(png)
    return {"methods": methods, "files": {"png": str(png)}}


def _make_run(tiny_drafter, tmp_path) -> Path:
    ckpt, _ = tiny_drafter
    run = tmp_path / "run"
    (run / "train").mkdir(parents=True)
    shutil.copytree(ckpt, run / "train" / "drafter")
    shutil.copy(ckpt.parent / "metrics.csv", run / "train" / "metrics.csv")
    log = {"data": {"vocab": {"size": 200, "coverage": 1.0}, "seconds": 1}, "train": {"validation": {"acc": [0.9, 0.8]}},
           "doctor": {"reports": [{"command": "dataset", "ok": True, "checks": [
               {"name": "slot 0", "ok": True, "detail": "holds layers.1.out", "level": "info", "fix": ""}]}]},
           "bench": _fake_bench(run)}
    write_report(run, "quick", {"self_prompts": 10}, log)
    return run


def test_report_markdown_and_html_content(tiny_drafter, tmp_path):
    run = _make_run(tiny_drafter, tmp_path)
    md = (run / "report.md").read_text()
    html = (run / "report.html").read_text()
    assert "SMALL run" in md and "eaglewire_tree" in md and "--format vllm" in md
    prov = json.loads((run / "train" / "drafter" / "eaglewire.json").read_text())
    assert str(prov["points"]["vllm"]) in md and str(prov["points"]["sglang"]) in md
    assert html.count("data:image/png;base64") == 2 and "<table>" in html


def test_report_renders_in_headless_chromium(tiny_drafter, tmp_path):
    from PIL import Image

    if CHROMIUM is None:
        cannot_run("Debian's chromium is not installed (.ci/run installs it)")

    run = _make_run(tiny_drafter, tmp_path)
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
    from eaglewire.demo.report import _prediction_rows

    off = {"command": "drafter", "offline": {"depth": 4, "tau_chain": 1.5, "acc": [0.4]}, "split": "val"}
    log = {"doctor": {"reports": [off]}, "bench": {"methods": {"eaglewire_chain": {"tau": 1.25}},
                                                   "config": {"min_prob": 0.0}}}
    assert _prediction_rows(log)[0][3:5] == ["1.25", "+20.0%"]
    log["bench"]["config"]["min_prob"] = 0.1
    row = _prediction_rows(log)[0]
    assert row[3] == "1.25 (with --min-prob 0.1)" and "not comparable" in row[4]


def test_demo_doctor_checks_the_exports_without_a_warning(tiny_drafter, tmp_path):
    """The demo's happy path checks what a user deploys (the exports, with the training config):
    no WARN row a user cannot act on, and the SGLang ids need no version warning."""
    import shutil

    from eaglewire.demo.run import DemoConfig, _doctor

    ckpt, data = tiny_drafter
    run = tmp_path / "run"
    shutil.copytree(ckpt, run / "train" / "drafter")
    (run / "data").symlink_to(data)
    reps = _doctor(DemoConfig(target="tiny:llama"), run)["reports"]
    configs = [r for r in reps if r["command"] == "config"]
    assert len(configs) == 2 and (run / "export" / "sglang" / "config.json").is_file()
    assert [r["command"] for r in reps] == ["dataset", "drafter", "config", "config"]
    for r in reps:  # every row of the happy path: dataset, drafter and both exports
        bad = [c for c in r["checks"] if not c["ok"]]
        assert bad == [], (r["command"], bad)
    for r in configs:  # the training config was found (in the export's own record), so it was checked
        assert any(c["name"] == "rope / norm" and "match training" in c["detail"] for c in r["checks"])
