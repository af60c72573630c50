"""The `eaglewire` command. Each stage module owns its config and its `run`;
this file only wires them into typer and turns EaglewireError into one line."""

from __future__ import annotations

import os
import sys

import typer

from eaglewire.infra.errors import EaglewireError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, run, export and verify EAGLE-3 drafters with provably right hidden-state wiring.")


def _register_stages() -> None:
    """Stage modules add their own commands (they import lazily inside `run`)."""
    import importlib

    for mod in ("eaglewire.target.cli", "eaglewire.data.cli", "eaglewire.training.cli", "eaglewire.decoding.cli",
                "eaglewire.export.cli", "eaglewire.serve.cli", "eaglewire.doctor.cli", "eaglewire.demo.run", "eaglewire.plan.estimate"):
        m = importlib.import_module(mod)
        m.register(app)


_register_stages()


def main() -> None:
    try:
        app()
    except EaglewireError as e:
        if os.environ.get("EAGLEWIRE_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
