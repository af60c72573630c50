"""The drafter on disk and in every engine's format: checkpoint, provenance, the engine configs and the GGUF.

May import: infra, targets, drafter, saved, engines.
"""
