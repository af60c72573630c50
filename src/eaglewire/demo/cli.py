"""`eaglewire demo`: registers the command; the run itself is :mod:`eaglewire.demo.run`."""

from __future__ import annotations

import contextlib
import dataclasses
import io

from eaglewire.demo.config import DemoConfig
from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit


def _print_summary(res: dict) -> None:
    s = res["summary"]
    if res.get("verdict"):
        print(f"\n{res['verdict']}")
    print("\n method            tok/s  vs generate  vs plain   tau")
    for name, m in s["methods"].items():
        tau = f"{m['tau']:.2f}" if m.get("tau") else "-"
        vp = f"{m['speedup_vs_plain']:.2f}x" if m.get("speedup_vs_plain") else "-"
        print(f" {name:<16}{m['tokens_per_s']:>7.1f}{m['speedup']:>12.2f}x{vp:>10}{tau:>6}")
    print(f"\n doctor: {'all checks pass' if s['doctor_ok'] else 'PROBLEMS (see report)'}")
    print(f" report: {res['report_html']}\n         {res['report_md']}")


def register(app) -> None:
    def run(cfg: DemoConfig) -> None:
        from eaglewire.demo.run import run_demo  # lazy: the stages load torch, `--help` must not

        if cfg.print_commands:  # printed by run_demo, one command per line (as JSON with --json)
            res = run_demo(dataclasses.replace(cfg, json=False)) if not cfg.json else None
            if cfg.json:
                with contextlib.redirect_stdout(io.StringIO()):
                    res = run_demo(cfg)
                emit(res, True, print)
            return
        emit(run_demo(cfg), cfg.json, _print_summary)

    build_command(app, "demo", DemoConfig, run, "Run the whole pipeline on the default target and write report.html/report.md.")
