"""Training data: prompt loading, self-generated prompts, loss masks and the draft vocabulary.

May import: infra, targets, drafter, saved, engines.
"""
