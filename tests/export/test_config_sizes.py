"""Sizes in a drafter's or an imported config.json are bounded before anything is allocated: 10^7 layers,
a 10^12 vocabulary or a 10^9 hidden size grew memory to GB; now one line naming the file and the field."""

from __future__ import annotations

import json
import resource

import pytest

from eaglewire.drafter.config import DrafterConfig
from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import DRAFTER_KEY, load_checkpoint
from eaglewire_testing.export_helpers import L, make_ckpt

HUGE = [("num_layers", 10**7), ("vocab_size", 10**12), ("hidden_size", 10**9), ("draft_vocab_size", 1e400),
        ("head_dim", "64"), ("intermediate_size", True)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _set(path, key, value, nested=None):
    raw = json.loads(path.read_text())
    (raw[nested] if nested else raw)[key] = value
    path.write_text(json.dumps(raw).replace("Infinity", "1e400"))


@pytest.mark.parametrize("field, value", HUGE)
def test_a_checkpoint_config_of_absurd_size_is_one_line_before_allocating(tmp_path, field, value):
    ck, _ = make_ckpt(tmp_path / "ck")
    _set(ck / "config.json", field, value, nested=DRAFTER_KEY)
    peak = _rss_mb()
    with pytest.raises(EaglewireError, match=rf"{ck}/config.json: .*field {field} = .*expected an integer in \[1, "):
        load_checkpoint(ck)
    assert _rss_mb() - peak < 200


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**7), ("vocab_size", 10**12), ("hidden_size", 10**9),
                                          ("intermediate_size", -1), ("draft_vocab_size", 10**12)])
def test_an_import_config_of_absurd_size_is_one_line_before_allocating(tmp_path, field, value):
    ck, _ = make_ckpt(tmp_path / "ck")
    src = run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s")) and tmp_path / "s"
    _set(src / "config.json", field, value)
    peak = _rss_mb()
    with pytest.raises(EaglewireError, match=rf"{src}/config.json: .*field {field} = .*expected an integer in \[1, "):
        run_import(ImportConfig(src=src, out=tmp_path / "imp", target_layers=L))
    assert _rss_mb() - peak < 200 and not (tmp_path / "imp").exists()


def test_a_config_claiming_more_layers_than_its_weights_allocates_nothing(tmp_path):
    """In bounds, but the weights hold one layer: refused from the shapes alone (a storage-free model)."""
    ck, _ = make_ckpt(tmp_path / "ck")
    _set(ck / "config.json", "num_layers", 2, nested=DRAFTER_KEY)
    _set(ck / "config.json", "intermediate_size", 10**7 - 1, nested=DRAFTER_KEY)  # 2 layers x 3 x 32 x 10^7 floats = 7.7 GB
    peak = _rss_mb()
    with pytest.raises(EaglewireError, match="tensors do not match the config"):
        load_checkpoint(ck)
    assert _rss_mb() - peak < 200


def test_real_sizes_stay_accepted():
    cfg = DrafterConfig(hidden_size=16384, intermediate_size=53248, num_attention_heads=128, num_key_value_heads=8,
                        head_dim=128, rms_norm_eps=1e-5, rope_theta=5e5, max_position_embeddings=131072,
                        target_hidden_size=16384, vocab_size=262144, draft_vocab_size=32000, num_layers=4)
    assert cfg.vocab_size == 262144 and isinstance(cfg.rope_theta, float)
