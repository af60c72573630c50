"""`eaglewire doctor`: find a hidden-state wiring bug in one command instead of days.

May import: infra, targets, drafter, saved, engines, export, data, decoding.
"""
