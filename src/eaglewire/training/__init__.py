"""Training a drafter: the loop, its inputs, online features, resumable state, checkpoint selection, DDP.

May import: infra, targets, drafter, saved, data, decoding.
"""
