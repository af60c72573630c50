"""Which process of a torchrun job this one is, read from the variables torchrun sets.

The data stages, training and the commands' printers all ask; one reader
keeps them agreeing (two processes that both believe they are rank 0 write
the same files). A process started without torchrun is rank 0 of 1. Nothing
here imports torch at module level, so a command can ask before loading it.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """This process's index on its node: the GPU it owns."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_world() -> tuple[int, int]:
    return rank(), world_size()


def distributed() -> bool:
    """Started by torchrun with more than one process (collectives needed)."""
    return world_size() > 1


def is_main() -> bool:
    """Rank 0: the process that writes shared files and prints the job's result."""
    return rank() == 0


def local_device(dev):
    """`cuda` (no index) under torchrun means this rank's GPU, `cuda:LOCAL_RANK`; anything else is kept."""
    import torch  # lazy: the CLI reads ranks while building its commands, before any torch is needed

    if distributed() and dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", local_rank())
    return dev
