"""What a dataset records about how it was made, and the rules that make `--resume` continue it with the same options."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from eaglewire.data.manifest import Manifest
from eaglewire.infra.errors import EaglewireError


def settings_from_manifest(cfg):
    """On --resume, the dataset's recorded extraction settings win (see `adopt_recorded`).

    So `eaglewire data extract DIR --resume`, the command our error messages
    print, continues or repairs a dataset exactly as it was made. Before the
    first manifest exists (a sharded run killed early) the target `data
    generate` recorded still wins: the answers are that target's own.
    """
    if not cfg.resume:
        return cfg
    if Manifest.exists(cfg.data):
        man = Manifest.load(cfg.data)
        ex = man.extract
        recorded = {"target": man.target.source, "points": ex.get("points"), "engine": man.capture_engine,
                    "store_dtype": ex.get("dtype"), "batch_tokens": ex.get("batch_tokens"),
                    "max_seq_len": ex.get("max_seq_len"), "shard_samples": ex.get("shard_samples")}
        return adopt_recorded(cfg, recorded, cfg.data / "manifest.json")
    gen = recorded_generate(cfg.data)
    return adopt_recorded(cfg, {"target": gen.get("target")}, cfg.data / GENERATE_CONFIG) if gen else cfg


def recorded_extract_settings(cfg):
    """The options a dataset's manifest (or its answers' record) fixes, applied to `cfg` as `--resume` would."""
    return settings_from_manifest(dataclasses.replace(cfg, resume=True))


GENERATE_CONFIG = "generate.config.json"


GENERATE_KEYS = ("target", "turns", "max_new_tokens", "temperature", "top_p", "seed", "max_prompt_tokens", "server")


def recorded_generate(d: Path) -> dict:
    """The options the answers in `d` were generated with ({} when none are recorded)."""
    p = Path(d) / GENERATE_CONFIG
    if not p.is_file():
        return {}
    try:
        return dict(json.loads(p.read_text()).get("config") or {})
    except (ValueError, AttributeError) as e:
        raise EaglewireError(f"{p}: unreadable ({e}); it records how the answers were made") from e


def _comparable(v):
    """Paths as strings, and `--points a,b --points c` as the list of names a manifest records."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return [n.strip() for x in v for n in x.split(",") if n.strip()]
    return v


def adopt_recorded(cfg, recorded: dict, where: Path):
    """Options left at their defaults take the recorded values; an option given with another value is refused.

    One rule for every resumed stage: a resumed run never mixes targets or
    settings, and never rewrites a record so that it claims settings the
    existing rows were not made with.
    """
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    upd, clash = {}, []
    for k, v in recorded.items():
        if v is None or k not in fields:
            continue
        f = fields[k]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        mine = getattr(cfg, k)
        if mine == default or mine is None:
            upd[k] = v
        elif _comparable(mine) != _comparable(v):
            clash.append(f"--{k.replace('_', '-')} {mine!r} (recorded: {v!r})")
    if clash:
        raise EaglewireError(f"{where}: --resume with other settings than the existing data was made with: "
                             f"{', '.join(clash)}; resume with the recorded values (or leave them out), or use a new --out")
    return dataclasses.replace(cfg, **upd)
