import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ARCHS = ["llama", "qwen3", "mistral", "deepseek_v3"]


@pytest.fixture(scope="session")
def tiny_targets():
    """Loaded tiny targets, one per architecture, built once per session."""
    from eaglewire.targets import load_target

    return {a: load_target(f"tiny:{a}") for a in ARCHS}


@pytest.fixture(scope="session")
def default_target():
    from eaglewire.targets import load_target

    return load_target("default")
