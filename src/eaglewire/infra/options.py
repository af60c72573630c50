"""One typed config per command: the dataclass *is* the CLI.

Each command declares a dataclass; `build_command` turns its fields into
typer options (so `--help` shows every field with its default), `--config
FILE.json` loads a saved config (unknown keys rejected), and `save_config`
writes the resolved config next to every artifact a command produces.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any

import typer

from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError


def opt(default: Any = dataclasses.MISSING, help: str = "", *, arg: bool = False, flag: str | None = None,
        factory: Any = None, ge: float | None = None, gt: float | None = None, le: float | None = None,
        lt: float | None = None, choices: tuple | None = None) -> Any:
    """A config field with CLI help. `arg=True` makes it positional.

    ``ge``/``gt``/``le``/``lt``/``choices`` are checked whenever a config is built
    (CLI flags, ``--config`` files, code), so a bad value stops the command
    before any work with one line naming the flag and what it accepts.
    """
    meta = {"help": help, "arg": arg, "flag": flag, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _cli_type(tp):
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _cli_type(args[0])
    return tp


def config_from_dict(cls, data: dict, source: str = "config") -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise EaglewireError(f"{source}: unknown key(s) {', '.join(unknown)} (expected a subset of: {', '.join(sorted(names))})")
    try:
        cfg = cls(**data)
    except TypeError as e:
        raise EaglewireError(f"{source}: {e}") from e
    check_ranges(cfg)
    return cfg


_BOUNDS = (("ge", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b),
           ("le", "<=", lambda v, b: v <= b), ("lt", "<", lambda v, b: v < b))


def check_ranges(cfg) -> None:
    """Raise EaglewireError for the first field outside its declared range or choices."""
    for f in dataclasses.fields(cfg):
        v, meta = getattr(cfg, f.name), f.metadata
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        if meta.get("choices") and v not in meta["choices"]:
            raise EaglewireError(f"{flag} {v!r}: expected one of {', '.join(map(str, meta['choices']))}")
        for key, _sym, ok in _BOUNDS:
            b = meta.get(key)
            if b is None or (v is None and f.default is None):  # None = "automatic" for an optional field
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not ok(v, b):
                want = " and ".join(f"{s} {meta[k]}" for k, s, _ in _BOUNDS if meta.get(k) is not None)
                raise EaglewireError(f"{flag} {v!r}: expected a number {want}")


def config_to_dict(cfg) -> dict:
    def conv(v):
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v
    return {f.name: conv(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def save_config(cfg, path: Path, extra: dict | None = None) -> None:
    data = {"command": type(cfg).__name__, "config": config_to_dict(cfg)}
    if extra:
        data.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, default=_jsonable)


def load_config_file(cls, path: Path) -> dict:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EaglewireError(f"--config {path}: cannot read JSON ({e})") from e
    if isinstance(raw, dict) and "config" in raw and "command" in raw:
        raw = raw["config"]  # a resolved config saved by eaglewire itself
    if not isinstance(raw, dict):
        raise EaglewireError(f"--config {path}: expected a JSON object of {cls.__name__} fields")
    config_from_dict(cls, raw, source=f"--config {path}")  # reject unknown keys early
    return raw


def build_command(app: typer.Typer, name: str, cls, run, help: str) -> None:
    """Register `run(cfg)` as a typer command whose options are the fields of `cls`."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else ...)
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        if meta.get("arg"):
            info = typer.Argument(default, help=meta.get("help", ""), show_default=default is not ...)
        elif hints[f.name] is bool:
            info = typer.Option(default, f"{flag}/--no-{flag[2:]}", help=meta.get("help", ""))
        else:
            info = typer.Option(default, flag, help=meta.get("help", ""))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                        annotation=_cli_type(hints[f.name])))
    params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                                    default=typer.Option(None, "--config", help="JSON file of these options (unknown keys rejected); flags given explicitly win")))

    def command(**kwargs):
        cfg_file = kwargs.pop("config")
        if cfg_file is not None:
            ctx = click_context()
            file_vals = load_config_file(cls, cfg_file)
            for k, v in file_vals.items():
                src = ctx.get_parameter_source(k) if ctx else None
                if src is None or src.name == "DEFAULT":
                    kwargs[k] = v
        cfg = config_from_dict(cls, {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()})
        return run(cfg)

    command.__signature__ = inspect.Signature(params)
    command.__doc__ = help
    app.command(name, help=help)(command)


def click_context():
    import click

    return click.get_current_context(silent=True)


def _jsonable(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    return str(o)
