"""The saved drafter, below every stage that reads it: its checkpoint directory, provenance, weight readers,
the on-disk and engine config formats, and the one default draft depth.

May import: infra, targets, drafter.
"""
