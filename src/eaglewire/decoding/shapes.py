"""The default draft shapes and gating, torch-free so that `eaglewire --help` stays fast.

Why these values: see the docstring of `decoding/engine.py` (CPU verify costs,
measured shapes) and `benchmarks/README.md` for the figures.
"""

from eaglewire.saved.depth import DEPTH  # the one default depth (see there)

DEFAULTS = {"chain_depth": DEPTH, "top_k": 3, "tree_depth": 2, "total_tokens": 7}
MIN_PROB = {"cpu": 0.1, "cuda": 0.0}  # --min-prob by device type (auto): where a wide verify costs a decode step, keep all
