import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # the package; tests/support

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


USER_PROMPTS = [
    "Write a short story about a robot who learns to paint.", "Explain why the sky is blue.",
    "What is 12 plus 30?", "Give me three ideas for a birthday party.", "Translate this sentence into French.",
    "Can you help me plan a trip to the mountains?", "Summarize the following text in one sentence.",
    "Write a Python function that adds two numbers.", "Hello, how are you today?", "Tell me about the sea.",
    "Why do fishermen go out every morning?", "List three Python data types.",
]


def build_tiny_dataset(root, arch="llama", n=24, max_new_tokens=24, vocab_size=200, store_dtype="fp32"):
    """A real (regenerated + extracted + vocab) dataset on a tiny target, for stage tests."""
    from eaglewire.data.config import DataExtractConfig, DataGenerateConfig, DataVocabConfig
    from eaglewire.data.pipeline import run_extract, run_generate, run_vocab

    prompts = root / "prompts.in.jsonl"
    import json

    prompts.write_text("".join(json.dumps({"prompt": f"{USER_PROMPTS[i % len(USER_PROMPTS)]} ({i})"}) + "\n" for i in range(n)))
    out = root / "ds"
    run_generate(DataGenerateConfig(out=out, target=f"tiny:{arch}", prompts=prompts, max_new_tokens=max_new_tokens,
                                batch_size=8, device="cpu"))
    run_extract(DataExtractConfig(data=out, target=f"tiny:{arch}", store_dtype=store_dtype, device="cpu", shard_samples=8))
    run_vocab(DataVocabConfig(data=out, size=vocab_size))
    return out


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    return build_tiny_dataset(tmp_path_factory.mktemp("tinyds"))


@pytest.fixture(scope="session")
def tiny_drafter(tiny_dataset, tmp_path_factory):
    """A briefly trained drafter on the tiny llama dataset: (checkpoint dir, dataset dir)."""
    from eaglewire.train import TrainConfig, run_train

    out = tmp_path_factory.mktemp("tinyrun")
    run_train(TrainConfig(data=tiny_dataset, out=out, device="cpu", max_steps=150, batch_size=4, lr=3e-3,
                          warmup_steps=5, ttt_steps=3, max_len=128, val_fraction=0.1, save_every=1000))
    return out / "drafter", tiny_dataset
