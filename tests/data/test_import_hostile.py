"""`data import` reads foreign files as hostile (src/eaglewire/data/foreign.py): two files with one sample number
are refused naming both, and token ids outside the target's vocabulary are refused at import naming the file
and the id, not later by `data vocab` by sample number. A refused import leaves nothing behind."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.data.config import DataImportConfig
from eaglewire.data.foreign import run_data_import
from eaglewire.infra.errors import EaglewireError

pytestmark = pytest.mark.unit

H, P = 64, 3  # tiny:llama's hidden size; three aux slots


def _hs(path, ids: list[int]):
    path.parent.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(len(ids))
    save_file({"hidden_states": torch.randn(len(ids), P + 1, H, generator=g),
               "token_ids": torch.tensor(ids, dtype=torch.int64)}, str(path))
    return path


def _sf(path, ids: list[int]):
    path.parent.mkdir(parents=True, exist_ok=True)
    T = len(ids)
    torch.save({"input_ids": torch.tensor(ids), "loss_mask": torch.ones(T, dtype=torch.long),
                "hidden_state": torch.randn(1, T, H), "aux_hidden_state": torch.randn(1, T, P * H)}, path)
    return path


def _import(src, out, **kw):
    return run_data_import(DataImportConfig(src=src, out=out, all_loss=True, target_layers=8, **kw))


@pytest.mark.parametrize("names", [("hidden_states/hs_0.safetensors", "hs_0.safetensors"),
                                   ("hidden_states/hs_1.safetensors", "hidden_states/hs_01.safetensors")])
def test_two_speculators_files_of_one_sample_number_are_refused_naming_both(tmp_path, names):
    src = tmp_path / "sp"
    for i, n in enumerate(names):
        _hs(src / n, [5, 6, 7 + i])
    _hs(src / "hidden_states" / "hs_2.safetensors", [1, 2, 3])
    with pytest.raises(EaglewireError) as e:
        _import(src, tmp_path / "ds")
    msg = str(e.value)
    assert all(str(src / n) in msg for n in names) and "both are sample" in msg, msg
    assert not (tmp_path / "ds").exists()  # refused before anything is written


def test_two_specforge_files_of_one_sample_number_are_refused(tmp_path):
    src = tmp_path / "sf"
    _sf(src / "rows_0-5000" / "data_3.ckpt", [1, 2, 3])
    _sf(src / "rows_5000-10000" / "data_3.ckpt", [4, 5, 6])
    with pytest.raises(EaglewireError, match=r"rows_0-5000/data_3.ckpt and .*rows_5000-10000/data_3.ckpt: both are "
                                             r"sample 3"):
        _import(src, tmp_path / "ds")


@pytest.mark.parametrize("bad, pos", [(1_000_000, 2), (-5, 1)])
def test_token_ids_outside_the_targets_vocabulary_are_refused_naming_the_file(tmp_path, bad, pos):
    src = tmp_path / "sp"
    _hs(src / "hidden_states" / "hs_0.safetensors", [1, 2, 3])
    ids = [4, 5, 6]
    ids[pos] = bad
    f = _hs(src / "hidden_states" / "hs_1.safetensors", ids)
    out = tmp_path / "ds"
    with pytest.raises(EaglewireError, match=rf"{f}: token id {bad} at position {pos} is outside the target's "
                                             r"vocabulary \[0, 384\)"):
        run_data_import(DataImportConfig(src=src, out=out, all_loss=True, target="tiny:llama", shard_samples=1))
    assert not out.exists()  # the first sample's shard was removed with the refusal


def test_a_negative_id_is_refused_without_a_target(tmp_path):
    src = tmp_path / "sf"
    f = _sf(src / "rows_0" / "data_0.ckpt", [1, -5, 3])
    with pytest.raises(EaglewireError, match=rf"{f}: token id -5 at position 1 is outside token ids \(>= 0\)"):
        _import(src, tmp_path / "ds")


def test_ids_in_range_and_distinct_numbers_still_import(tmp_path):
    src = tmp_path / "sp"
    _hs(src / "hidden_states" / "hs_0.safetensors", [0, 383, 7])
    _hs(src / "hidden_states" / "hs_10.safetensors", [1, 2, 3])
    r = run_data_import(DataImportConfig(src=src, out=tmp_path / "ds", all_loss=True, target="tiny:llama"))
    assert r["num_samples"] == 2
