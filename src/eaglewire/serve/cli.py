"""`eaglewire serve`: registers the command; what it does is :mod:`eaglewire.serve.serving`."""

from __future__ import annotations

import typer

from eaglewire.infra.options import build_command
from eaglewire.serve.config import ServeConfig


def _run(cfg: ServeConfig) -> dict:
    from eaglewire.serve.serving import run_serve  # lazy: it loads torch, `--help` must not

    return run_serve(cfg)


def register(app: typer.Typer) -> None:
    build_command(app, "serve", ServeConfig, _run,
                  "Serve a trained drafter with vLLM (exported with the right ids) and verify the served acceptance.")
