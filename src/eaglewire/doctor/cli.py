"""`eaglewire doctor {dataset,drafter,config,online,live}`: verdict table, --json, non-zero exit on problems.

Only registration and printing: what each command does is in :mod:`eaglewire.doctor.commands`,
imported when a command runs (it loads torch; `--help` must not)."""

from __future__ import annotations

import typer

from eaglewire.doctor.config import (
    DoctorDatasetConfig,
    DoctorDrafterConfig,
    DoctorEngineConfig,
    DoctorLiveConfig,
    DoctorOnlineConfig,
)
from eaglewire.infra.options import build_command


def _printed(body: str):
    """A command running `commands.<body>(cfg)`, printing its report and exiting with the report's code."""
    def run(cfg) -> None:
        from eaglewire.doctor import commands  # lazy: torch

        rep = getattr(commands, body)(cfg)
        rep.print(cfg.json)
        raise typer.Exit(rep.exit_code())

    return run


run_dataset, run_drafter, run_config, run_live, run_online = (
    _printed(f"{c}_report") for c in ("dataset", "drafter", "config", "live", "online"))


def register(app: typer.Typer) -> None:
    doc = typer.Typer(no_args_is_help=True, help="Find hidden-state wiring bugs: dataset slots, drafter, deployment config, online.")
    build_command(doc, "dataset", DoctorDatasetConfig, run_dataset,
                  "Identify which physical target tensor each stored feature slot holds.")
    build_command(doc, "drafter", DoctorDrafterConfig, run_drafter,
                  "Standalone drafter test: acc per TTT step, offline chain tau, d2t convention.")
    build_command(doc, "config", DoctorEngineConfig, run_config,
                  "Which tensors will this engine feed the drafter? Compare with training and print the fix.")
    build_command(doc, "live", DoctorLiveConfig, run_live,
                  "Send held-out prompts to a running engine; compare its per-position acceptance with eaglewire's prediction.")
    build_command(doc, "online", DoctorOnlineConfig, run_online,
                  "Run the engine on dataset prompts; compare the features the drafter gets with training, and online vs offline tau.")
    app.add_typer(doc, name="doctor")
