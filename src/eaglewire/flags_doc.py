"""docs/flags.md, written from the command definitions themselves.

A concept has one flag name across commands; a page written by hand would
drift from the dataclasses, so this builds it from them (and the old names
from `RENAMED`), and tests/test_flags_doc.py fails when the page
differs. Regenerate: `python -m eaglewire.flags_doc > docs/flags.md`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, NamedTuple

import typer

from eaglewire.infra.options import CONFIG_HELP, RENAMED, field_aliases, flag_of

INTRO = """\
# Flags

Generated from the command definitions by `src/eaglewire/flags_doc.py`
(`python -m eaglewire.flags_doc > docs/flags.md`); a test fails when this
page and the CLI differ. One concept has one flag name on every command that
takes it. Where a flag's default or meaning differs between commands, it has
one row per variant. Booleans also take `--no-FLAG`; positional arguments are
not listed.

Choices made so that names agree:

- `--vocab-size` is the draft vocab size everywhere (`data vocab`, `data build`, `train`, `plan`).
- `--batch-size` is the training micro-batch (`train`, `plan`); `--gen-batch-size` is the
  generation batch (`data generate`, `data build`, `plan`).
- `--max-len` is train's truncation length, also in `plan`.
- `--device` is where a command runs; `auto` is CUDA when present, else CPU (`plan` only sizes,
  so `plan --device cuda` works on a machine without a GPU).
- `--target-layers` is the target's decoder layer count; `train --num-layers` is the drafter's.
- `--layers-from` is the engine whose meaning given layer ids have.
- A serving engine defaults to vLLM (what `eaglewire serve` runs and the tests serve with for
  real) unless the artifact records one: `doctor config` on an export checks the engine the
  export was written for. `data extract/build --engine` is the capture engine
  (transformers in this process, or a vLLM server) and defaults to transformers.
"""


class Row(NamedTuple):
    command: str
    flag: str
    default: str
    meaning: str


def config_commands(app) -> list[tuple[str, Any]]:
    """(command path, its config dataclass) for every command built by `build_command`."""
    out = []

    def walk(cmd, path: list[str]) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            cls = getattr(sub.callback, "config_class", None) if sub.callback else None
            if cls is not None:
                out.append((" ".join([*path, name]), cls))
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        return "required"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    return f"`{v!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flag_rows(app) -> list[Row]:
    """One row per (command, flag), `--config` included; positional arguments left out."""
    rows = []
    for cmd, cls in config_commands(app):
        for f in dataclasses.fields(cls):
            if not f.metadata.get("arg"):
                rows.append(Row(cmd, flag_of(f), _default(f), f.metadata.get("help", "")))
        rows.append(Row(cmd, "--config", "`None`", CONFIG_HELP))
    return rows


def alias_rows(app) -> list[tuple[str, str, str, str]]:
    """(old flag, flag now, command, old config key) for every deprecated alias a command accepts."""
    out = []
    for cmd, cls in config_commands(app):
        names = {f.name for f in dataclasses.fields(cls)}
        for _f, old, r in field_aliases(cls):
            out.append((old, r.new, cmd, f"`{r.old_key}`" if r.old_key not in names else "(unchanged)"))
    return sorted(out)


def _flags_table(rows: list[Row]) -> list[str]:
    all_cmds = {r.command for r in rows}
    by_flag: dict[str, dict[tuple[str, str], list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_flag[r.flag][(r.default, r.meaning)].append(r.command)
    lines = ["| flag | commands | default | meaning |", "|---|---|---|---|"]
    for flag in sorted(by_flag):
        variants = sorted(by_flag[flag].items(), key=lambda kv: sorted(kv[1]))
        for i, ((default, meaning), cmds) in enumerate(variants):
            who = "every command" if set(cmds) == all_cmds else ", ".join(f"`{c}`" for c in sorted(cmds))
            lines.append(f"| {f'`{flag}`' if i == 0 else ''} | {who} | {default} | {_cell(meaning)} |")
    return lines


def _alias_table(aliases: list[tuple[str, str, str, str]]) -> list[str]:
    grouped: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for old, new, cmd, key in aliases:
        grouped[(old, new, key)].append(cmd)
    lines = ["| old flag | use | on | old `--config` key | the old name elsewhere |", "|---|---|---|---|---|"]
    for (old, new, key), cmds in sorted(grouped.items()):
        r = RENAMED[old]
        elsewhere = f"{r.still} ({', '.join(f'`{c}`' for c in r.still_on)})" if r.still else ""
        lines.append(f"| `{old}` | `{new}` | {', '.join(f'`{c}`' for c in sorted(cmds))} | {key} | {elsewhere} |")
    return lines


def flags_markdown(app) -> str:
    parts = [INTRO, "## Every flag", "", *_flags_table(flag_rows(app)), "", "## Deprecated names", "",
             "Hidden from `--help`; each still works and prints one line to stderr "
             "(`--size is deprecated: use --vocab-size`). Saved configs (`--config FILE.json`, "
             "`*.config.json`) holding an old key load with the key mapped to its field.", "",
             *_alias_table(alias_rows(app)), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    from eaglewire.cli import app  # the entry point reads the app it documents

    print(flags_markdown(app), end="")
