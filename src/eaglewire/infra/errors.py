"""One exception type for user-facing errors.

The CLI prints these as a single line (no traceback unless EAGLEWIRE_DEBUG=1),
so the message must name what was given and what was expected.
"""


class EaglewireError(Exception):
    """A problem with the user's input, reported in one line."""
