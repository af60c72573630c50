"""Speculative decoding with EAGLE-3 drafters (chain and EAGLE-2 tree), lossless.

Entry points: :class:`SpecEngine` + :class:`SpecConfig` (engine.py), the
``generate`` and ``bench`` commands (cli.py). See engine.py for the loop and
the default shapes chosen for CPU decoding.
"""
