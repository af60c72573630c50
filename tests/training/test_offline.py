"""Offline training (stored features) never builds the target: on a tiny Kimi-K2.5, and on a quantized copy of
it, `train` (with selection, and resumed) runs with every way of building the model made to fail, and holds
the embedding, head and final norm alone.

References: transformers' `from_pretrained` and eaglewire's `load_target` are the builders made to raise;
the bytes held are counted against the config's sizes.
"""

from __future__ import annotations

import shutil

import pytest

import eaglewire.training.offline as offline
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.shards import frozen_bytes
from eaglewire.training.config import TrainConfig
from eaglewire.training.loop import run_train
from eaglewire_testing.quantized import quantized_copy

pytestmark = pytest.mark.unit
KW = dict(device="cpu", batch_size=2, ttt_steps=2, max_len=48, val_fraction=0.25, save_every=1, warmup_steps=1)


@pytest.fixture(scope="module")
def kimi_dataset(tmp_path_factory):
    from eaglewire_testing.tinydata import build_tiny_dataset

    return build_tiny_dataset(tmp_path_factory.mktemp("kimi"), arch="kimi_k25", n=4, max_new_tokens=4, vocab_size=64)


@pytest.fixture
def no_builds(no_target_builds, monkeypatch):
    """Every way the target could be built raises (tests/training/conftest.py); `held` records what the frozen
    target holds."""
    held = []
    orig = offline.load_frozen

    def spy(*a, **kw):
        t = orig(*a, **kw)
        held.append((frozen_bytes(t), t))
        return t

    monkeypatch.setattr(offline, "load_frozen", spy)
    return held


def _check_held(held):
    nbytes, t = held[-1]
    V, H = t.vocab_size, t.hidden_size
    assert nbytes == 4 * (2 * V * H + H)  # fp32 embedding + head + final norm, per rank; no layer
    assert all(p.is_meta for p in decoder_stack(t.model).layers.parameters())


def test_train_select_and_resume_on_kimi_k25_never_build_the_target(kimi_dataset, tmp_path, no_builds):
    out = tmp_path / "r"
    res = run_train(TrainConfig(data=kimi_dataset, out=out, max_steps=2, select="loss", eval_every=1, **KW))
    assert res["steps"] == 2 and (out / "drafter" / "model.safetensors").is_file()
    _check_held(no_builds)
    shutil.rmtree(out / "drafter")  # as if killed after its last save
    run_train(TrainConfig(data=kimi_dataset, out=out, max_steps=2, select="loss", eval_every=1, resume=True, **KW))
    assert (out / "drafter" / "model.safetensors").is_file()
    _check_held(no_builds)


def test_a_quantized_target_trains_from_its_bf16_embedding_and_head(kimi_dataset, tmp_path, no_builds):
    d = quantized_copy("kimi_k25", tmp_path / "kimi-int4")
    run_train(TrainConfig(data=kimi_dataset, out=tmp_path / "q", target=str(d), max_steps=1, init="head", **KW))
    _check_held(no_builds)
    with pytest.raises(EaglewireError, match="quantized.*use --init head"):
        run_train(TrainConfig(data=kimi_dataset, out=tmp_path / "t", target=str(d), max_steps=1, init="target", **KW))
    assert not (tmp_path / "t").exists()  # refused before anything was written
