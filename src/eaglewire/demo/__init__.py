"""The whole pipeline as one command (`demo`): its stages, presets, report and findings.

May import: infra, targets, drafter, saved, engines, export, data, decoding, training, doctor.
"""
