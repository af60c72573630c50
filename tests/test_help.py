"""`--help` of every command and subcommand renders: one broken help text (rich markup in it) fails here.

The tree is walked from the click command typer builds out of `eaglewire.cli.app`,
so a command added later is covered without editing this file.
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from eaglewire import cli


def _paths(cmd, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's argv path; a group is whatever has subcommands (typer vendors its own click)."""
    out = [path]
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        out += _paths(sub, (*path, name))
    return out


COMMANDS = _paths(typer.main.get_command(cli.app))


def test_the_walk_finds_the_nested_commands():
    assert ("data", "build") in COMMANDS and ("data", "generate") in COMMANDS and ("inspect",) in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "eaglewire")
def test_help_renders(path):
    r = CliRunner().invoke(cli.app, [*path, "--help"], terminal_width=100)
    assert r.exit_code == 0, f"eaglewire {' '.join(path)} --help: exit {r.exit_code}: {r.output[-400:]} {r.exception!r}"
    assert "Usage" in r.output
