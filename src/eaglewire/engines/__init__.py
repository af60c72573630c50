"""The engines eaglewire talks to: how each is installed, started, spoken to and captured from.

May import: infra, targets, saved.
"""
