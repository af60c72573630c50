"""Shared plumbing every room stands on: options, output, atomic writes, checksums, locks, ranks, errors, children.

May import: nothing (the bottom room).
"""
