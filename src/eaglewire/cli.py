"""The `eaglewire` command. Each stage module owns its config and its `run`;
this file only wires them into typer and turns EaglewireError into one line."""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

from eaglewire.infra.errors import EaglewireError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, run, export and verify EAGLE-3 drafters with provably right hidden-state wiring.")


def _version(value: bool) -> None:
    if value:
        from eaglewire import __version__

        print(f"eaglewire {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                       callback=_version)) -> None:
    """Train, run, export and verify EAGLE-3 drafters with provably right hidden-state wiring."""


def _register_stages() -> None:
    """Stage modules add their own commands (they import lazily inside `run`)."""
    import importlib

    for mod in ("eaglewire.targets.cli", "eaglewire.data.cli", "eaglewire.training.cli", "eaglewire.decoding.cli",
                "eaglewire.export.cli", "eaglewire.serve.cli", "eaglewire.doctor.cli", "eaglewire.demo.cli", "eaglewire.plan.cli"):
        m = importlib.import_module(mod)
        m.register(app)


_register_stages()


_interrupted = False


def _on_sigint(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def main() -> None:
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_sigint) if main_thread else None
    try:
        app()
    except SystemExit as e:
        # click turned Ctrl-C into "Aborted!" + exit 1, after every `finally` ran; exit 0: the command stopped on
        # Ctrl-C as its normal end (`serve`) and said so itself
        if _interrupted and e.code not in (0, None):
            _exit_interrupted()
        raise
    except EaglewireError as e:
        if os.environ.get("EAGLEWIRE_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        _exit_interrupted()
    finally:
        if main_thread:  # in-process callers (tests) get their own Ctrl-C handling back
            signal.signal(signal.SIGINT, previous)


def _exit_interrupted() -> None:
    """Every artifact is written whole (atomic renames, appended rows), so stopping loses only work in
    flight. os._exit: worker threads still waiting on a server would otherwise hold the process for
    their retries (minutes) at interpreter exit."""
    print("interrupted: what was written is kept; rerun the command with --resume to continue", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)


if __name__ == "__main__":
    main()
