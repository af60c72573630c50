"""One typed config per command: the dataclass *is* the CLI.

Each command declares a dataclass; `build_command` turns its fields into
typer options (so `--help` shows every field with its default), `--config
FILE.json` loads a saved config (unknown keys rejected), and `save_config`
writes the resolved config next to every artifact a command produces.

A concept has one flag name across commands (docs/flags.md, generated from
these definitions). When one is renamed, the old flag keeps working as a hidden
alias that says it is deprecated, and configs saved under the old field name
still load: `RENAMED` below is the one record of both.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import typer

from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError, did_you_mean
from eaglewire.infra.ranks import is_main


@dataclasses.dataclass(frozen=True)
class Renamed:
    """Where an old flag went. `old_key` is the field name configs saved before the rename hold;
    `still` is what the old name means on the commands `still_on`, where it is a flag for another concept."""

    new: str
    old_key: str
    still: str = ""
    still_on: tuple[str, ...] = ()


# Old flag -> its one name now. A field accepts an old flag only by naming it in opt(aliases=...),
# so a name reused for another concept (`--num-layers` is train's drafter layers) is an alias
# only on the fields that declare it.
RENAMED: dict[str, Renamed] = {
    "--size": Renamed("--vocab-size", "size"),
    "--draft-vocab": Renamed("--vocab-size", "draft_vocab"),
    "--gen-batch": Renamed("--gen-batch-size", "gen_batch"),
    "--batch-size": Renamed("--gen-batch-size", "batch_size", "the training micro-batch", ("plan", "train")),
    "--train-batch": Renamed("--batch-size", "train_batch"),
    "--train-max-len": Renamed("--max-len", "train_max_len"),
    "--device-type": Renamed("--device", "device_type"),
    "--num-layers": Renamed("--target-layers", "num_layers", "the drafter's layer count", ("train",)),
    "--from": Renamed("--layers-from", "from_engine"),
    "--speculative-tokens": Renamed("--depth", "speculative_tokens"),
    "--engine": Renamed("--layers-from", "engine", "the engine that serves or captures",
                        ("doctor config", "serve", "data extract", "data build", "train")),
}


def opt(default: Any = dataclasses.MISSING, help: str = "", *, arg: bool = False, flag: str | None = None,
        factory: Any = None, ge: float | None = None, gt: float | None = None, le: float | None = None,
        lt: float | None = None, choices: tuple | None = None, aliases: tuple[str, ...] = ()) -> Any:
    """A config field with CLI help. `arg=True` makes it positional.

    ``ge``/``gt``/``le``/``lt``/``choices`` are checked whenever a config is built
    (CLI flags, ``--config`` files, code), so a bad value stops the command
    before any work with one line naming the flag and what it accepts.
    ``aliases`` are this field's old flags (each must be in `RENAMED`), kept so
    that scripts and saved configs written before a rename still work.
    """
    meta = {"help": help, "arg": arg, "flag": flag, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices,
            "aliases": tuple(aliases)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _cli_type(tp):
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _cli_type(args[0])
    return tp


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def field_aliases(cls) -> list[tuple[dataclasses.Field, str, Renamed]]:
    """(field, old flag, its RENAMED entry) for every alias `cls` declares; a wrong declaration is a bug."""
    out = []
    for f in dataclasses.fields(cls):
        for old in f.metadata.get("aliases", ()):
            r = RENAMED.get(old)
            if r is None or r.new != flag_of(f):
                raise ValueError(f"{cls.__name__}.{f.name}: alias {old} must be in RENAMED as -> {flag_of(f)}")
            out.append((f, old, r))
    return out


def deprecation_note(old: str, r: Renamed) -> str:
    return f"{old} is deprecated: use {r.new}" + (f"; {old} means {r.still} ({', '.join(r.still_on)})"
                                                   if r.still else "")


def _warn(line: str) -> None:
    if is_main():  # under torchrun: once per job, not once per rank
        print(line, file=sys.stderr)


def renamed_keys(cls, data: dict, source: str) -> dict:
    """`data` with keys saved under a field's old name moved to its name now (one stderr line each)."""
    out = dict(data)
    names = {f.name for f in dataclasses.fields(cls)}
    for f, _old, r in field_aliases(cls):
        if r.old_key in names or r.old_key not in out:
            continue  # the field kept its name (only the flag changed), or the old key is absent
        if f.name in out:
            raise EaglewireError(f"{source}: both {r.old_key!r} (the old name) and {f.name!r} given: keep {f.name!r}")
        _warn(f"{source}: key {r.old_key!r} is deprecated: use {f.name!r}")
        out[f.name] = out.pop(r.old_key)
    return out


def config_from_dict(cls, data: dict, source: str = "config", prefixes: dict[str, str] | None = None) -> Any:
    data = renamed_keys(cls, data, source)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise EaglewireError(f"{source}: unknown key(s) {', '.join(unknown)} (expected a subset of: {', '.join(sorted(names))})")
    try:
        cfg = cls(**data)
    except TypeError as e:
        raise EaglewireError(f"{source}: {e}") from e
    check_ranges(cfg, prefixes)
    return cfg


_BOUNDS = (("ge", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b),
           ("le", "<=", lambda v, b: v <= b), ("lt", "<", lambda v, b: v < b))


def check_ranges(cfg, prefixes: dict[str, str] | None = None) -> None:
    """Raise EaglewireError for the first field outside its declared range or choices.

    `prefixes` names where a field's value came from when not from its flag (a --config file)."""
    for f in dataclasses.fields(cfg):
        v, meta = getattr(cfg, f.name), f.metadata
        flag = (prefixes or {}).get(f.name, "") + flag_of(f)
        if meta.get("choices") and v not in meta["choices"]:
            raise EaglewireError(f"{flag} {v!r}: expected one of {', '.join(map(str, meta['choices']))}"
                                 + did_you_mean(v, meta["choices"]))
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
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or bytes; RecursionError: too deep
        raise EaglewireError(f"--config {path}: cannot read JSON ({e})") from e
    if isinstance(raw, dict) and "config" in raw and "command" in raw:
        raw = raw["config"]  # a resolved config saved by eaglewire itself
    if not isinstance(raw, dict):
        raise EaglewireError(f"--config {path}: expected a JSON object of {cls.__name__} fields")
    raw = renamed_keys(cls, raw, f"--config {path}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)  # rejected early; required options may come as flags (a recipe file)
    if unknown:
        raise EaglewireError(f"--config {path}: unknown key(s) {', '.join(unknown)} "
                             f"(expected a subset of: {', '.join(sorted(names))})")
    hints = typing.get_type_hints(cls)
    return {k: _typed(v, hints[k], f"--config {path}: {k}") for k, v in raw.items()}


_JSON_OF = {Path: (str,), str: (str,), int: (int,), float: (int, float), bool: (bool,)}
_WANT = {Path: "a path", str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _typed(v, hint, where: str):
    """A --config value as the field's type (a path string becomes a Path), or one line naming the key."""
    optional = type(None) in typing.get_args(hint)
    tp = _cli_type(hint)
    if v is None and optional:
        return None
    if typing.get_origin(tp) is list:
        if not isinstance(v, list):
            raise EaglewireError(f"{where} = {str(v)[:60]}: expected a JSON list")
        return [_typed(x, typing.get_args(tp)[0], where) for x in v]
    ok = _JSON_OF.get(tp)
    if ok is None:
        return v
    if not isinstance(v, ok) or (tp is not bool and isinstance(v, bool)):
        raise EaglewireError(f"{where} = {v!r:.60}: expected {_WANT[tp]}")
    return Path(v) if tp is Path else v


_KW = inspect.Parameter.KEYWORD_ONLY
CONFIG_HELP = "JSON file of these options (unknown keys rejected, old key names mapped); flags given explicitly win"
_CTX = "_typer_context"  # typer passes the click context to a parameter annotated typer.Context


def _alias_param(old: str) -> str:
    return "deprecated_" + old[2:].replace("-", "_")


def _field_params(f: dataclasses.Field, hint) -> list[inspect.Parameter]:
    """The typer parameter of one field, then a hidden one per old flag of it."""
    meta, flag = f.metadata, flag_of(f)
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else ...)
    text = meta.get("help", "")
    if default is ...:  # required, but an old flag or a --config file may give it: checked once those are applied
        default, text = None, f"{text} [required]"
    if meta.get("arg"):
        info = typer.Argument(default, help=text, show_default=default is not None)
    elif hint is bool:
        info = typer.Option(default, f"{flag}/--no-{flag[2:]}", help=text)
    else:
        info = typer.Option(default, flag, help=text)
    out = [inspect.Parameter(f.name, _KW, default=info, annotation=_cli_type(hint))]
    for old in meta.get("aliases", ()):
        decl = f"{old}/--no-{old[2:]}" if hint is bool else old
        out.append(inspect.Parameter(_alias_param(old), _KW, annotation=_cli_type(hint) | None,
                                     default=typer.Option(None, decl, hidden=True)))
    return out


def _given(ctx, name: str) -> bool:
    """Set on the command line (not a default), so it wins over a --config file."""
    src = ctx.get_parameter_source(name) if ctx is not None else None
    return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")


def _apply_aliases(cls, kwargs: dict, given: set[str]) -> None:
    """Move values given under old flags to their fields (one stderr line each)."""
    for f, old, r in field_aliases(cls):
        v = kwargs.pop(_alias_param(old))
        if v is None or (isinstance(v, (list, tuple)) and not v):
            continue
        if f.name in given:
            raise EaglewireError(f"{old} and {r.new} both given: use {r.new} only")
        _warn(deprecation_note(old, r))
        kwargs[f.name] = v
        given.add(f.name)


def build_command(app: typer.Typer, name: str, cls, run, help: str) -> None:
    """Register `run(cfg)` as a typer command whose options are the fields of `cls`.

    Precedence: a flag on the command line (new name, else an old one), then `--config`, then the default.
    """
    hints = typing.get_type_hints(cls)
    field_aliases(cls)  # a wrong alias declaration fails when the CLI is built, not when a user types it
    params = [p for f in dataclasses.fields(cls) for p in _field_params(f, hints[f.name])]
    params.append(inspect.Parameter("config", _KW, annotation=Path | None,
                                    default=typer.Option(None, "--config", help=CONFIG_HELP)))
    params.append(inspect.Parameter(_CTX, _KW, annotation=typer.Context))
    required = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]

    def command(**kwargs):
        ctx, cfg_file = kwargs.pop(_CTX), kwargs.pop("config")
        given = {k for k in kwargs if _given(ctx, k)}
        _apply_aliases(cls, kwargs, given)
        from_file = {}
        if cfg_file is not None:
            from_file = {k: v for k, v in load_config_file(cls, cfg_file).items() if k not in given}
            kwargs.update(from_file)
        for f in required:
            if kwargs.get(f.name) is None:
                name = f.name.upper() if f.metadata.get("arg") else flag_of(f)
                raise EaglewireError(f"missing {name} (on the command line or in --config): {f.metadata.get('help', '')}")
        cfg = config_from_dict(cls, {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()},
                               prefixes={k: f"--config {cfg_file}: " for k in from_file})
        return run(cfg)

    command.__signature__ = inspect.Signature(params)
    command.__doc__ = help
    command.config_class = cls  # for docs/flags.md (flags_doc.py); typer's wrapper keeps it
    app.command(name, help=help)(command)


def _jsonable(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    return str(o)


def to_argv(cfg, always: tuple[str, ...] = ()) -> list[str]:
    """The command-line arguments that rebuild `cfg` through its command (defaults left out, but `always`).

    So a program that builds configs in code (the demo) can print exactly the
    commands a user would type to run the same thing by hand.
    """
    pos, flags = [], []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if f.metadata.get("arg"):
            pos += [_argv_value(x) for x in v] if isinstance(v, list | tuple) else [_argv_value(v)]
        elif v is None:
            continue  # None is "automatic": the default any command would use
        elif v != default or (f.name in always and v != ""):
            flag = flag_of(f)
            if isinstance(v, bool):
                flags.append(flag if v else f"--no-{flag[2:]}")
            elif isinstance(v, list | tuple):
                for x in v:
                    flags += [flag, str(x)]
            else:
                flags += [flag, _argv_value(v)]
    return pos + flags


def _argv_value(v) -> str:
    if isinstance(v, float):  # repr round-trips exactly; the short form when it is the same number
        return f"{v:g}" if float(f"{v:g}") == v else repr(v)
    return str(v)
