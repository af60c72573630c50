"""Sizing before a run (`plan`): a target's shape without its weights and the cost of each stage.

May import: infra, targets, drafter, data, training.
"""
