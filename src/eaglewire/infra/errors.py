"""One exception type for user-facing errors.

The CLI prints these as a single line (no traceback unless EAGLEWIRE_DEBUG=1),
so the message must name what was given and what was expected.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class EaglewireError(Exception):
    """A problem with the user's input, reported in one line."""


def did_you_mean(value: object, choices: Iterable) -> str:
    """'; did you mean 'x'?' when a string is close to one of `choices` (a typo), else ''."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
