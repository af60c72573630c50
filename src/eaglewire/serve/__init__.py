"""The `serve` command: export a run for an engine, start the engine, check its served acceptance.

May import: infra, targets, saved, engines, export, doctor, plan.
"""
