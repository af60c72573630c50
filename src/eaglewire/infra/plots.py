"""matplotlib on the file-only Agg backend, for the charts the bench and the demo report write."""

from __future__ import annotations


def pyplot():
    """pyplot with the Agg backend set first (no display on a server or in CI)."""
    import matplotlib  # lazy: ~0.5 s to import, and only the commands that draw a chart need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen, as matplotlib requires

    return plt
