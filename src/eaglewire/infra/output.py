"""How every command prints its result: one JSON document with `--json`, else lines for a person.

Scripts read the JSON (`eaglewire bench --json | jq ...`), so every command
prints it the same way: indented, with paths and other non-JSON values as strings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from eaglewire.infra.options import opt


def json_flag(help: str = "print JSON") -> Any:
    """The `--json` field of a command's config."""
    return opt(False, help)


def to_json(result: Any) -> str:
    return json.dumps(result, indent=2, default=str)


def emit(result: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    if as_json:
        print(to_json(result))
    else:
        human(result)
