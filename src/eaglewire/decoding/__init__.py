"""Speculative decoding with EAGLE-3 drafters (chain and EAGLE-2 tree), lossless; read reference.py first.

May import: infra, targets, drafter, saved, data.

reference.py is the whole greedy chain loop in ~50 lines with nothing
optimised; the engine (engine.py: :class:`SpecEngine` + :class:`SpecConfig`)
is that loop made fast (KV caches, lean kernels, trees, sampling) and its
tests hold it to the reference. The ``generate`` and ``bench`` commands are in cli.py.
"""
