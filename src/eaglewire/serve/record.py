"""What `serve` leaves beside its export (serve.json) and says while it works (progress lines on stderr).

The record names its files relative to its own directory: `doctor live --drafter RUN`, run from any
working directory, finds the export the server loaded (a path relative to serve's working directory
was joined onto the record's directory a second time), and the gate the server drafts with, which
llama-server does not report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from eaglewire.doctor.records import SERVE_RECORD
from eaglewire.infra.atomic import write_json_atomic

RELATIVE_FIELDS = ("export", "log", "target_gguf")


def say_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def say(cfg, msg: str) -> None:
    """A progress line, unless --json (a script reads stdout and wants stderr quiet too)."""
    if not cfg.json:
        say_line(msg)


def write_record(out: Path, res: dict) -> Path:
    """serve.json in `out`: `res` with the paths inside `out` written relative to it."""
    rec = dict(res)
    home = Path(out).resolve()
    for k in RELATIVE_FIELDS:
        if isinstance(rec.get(k), str) and Path(rec[k]).resolve().is_relative_to(home):
            rec[k] = os.path.relpath(Path(rec[k]).resolve(), home)
    write_json_atomic(Path(out) / SERVE_RECORD, rec)
    return Path(out) / SERVE_RECORD
