"""Hub ids (`org/name`) resolved through the local Hugging Face cache, never the network.

Why offline only: eaglewire runs where the hub is often unreachable (cluster
nodes, air-gapped machines), and a lookup that retries for minutes before it
fails is worse than a one-line error saying how to fill the cache. The cache
layout (refs/main -> snapshots/<sha>/) is huggingface_hub's to read.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.utils import HFValidationError, validate_repo_id

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import close_path_hint


def is_repo_id(name: str) -> bool:
    """`org/name` as the hub spells ids (a local path that does not exist may look the same)."""
    if name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_cache() -> Path:
    """The cache huggingface_hub reads; HF_HUB_CACHE is read now, not at its import (tests and embedders set it late)."""
    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def cached_snapshot(repo_id: str, repo_type: str = "model", what: str = "") -> Path:
    """The cached snapshot directory of `repo_id` at its main ref, for a name that is not a local path.

    The error covers both readings of the name in one line: the local path
    (with a close existing one, if any) and the hub id (with how to fetch
    it). `what` starts it, e.g. "target 'org/name'".
    """
    cache = hub_cache()
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        flag = "" if repo_type == "model" else f" --repo-type {repo_type}"
        raise EaglewireError(
            f"{what or repo_id}: no local path {repo_id}{close_path_hint(Path(repo_id))}, and the {repo_type} "
            f"{repo_id} is not in the local Hugging Face cache at {cache} (eaglewire never downloads); fetch it "
            f"on a machine with network "
            f"(`hf download {repo_id}{flag}`, formerly `huggingface-cli download`) and copy that cache here, "
            "or set HF_HUB_CACHE to a cache that holds it"
        ) from None
