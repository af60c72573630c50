"""eaglewire: EAGLE-3 drafters whose hidden-state wiring is right by construction."""

__version__ = "0.1.0"
