"""`data import`: speculators hidden-state files and SpecForge captures -> eaglewire datasets."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.data.config import DataImportConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.foreign import run_data_import
from eaglewire.infra.errors import EaglewireError

H, P, N = 64, 3, 5


def _speculators_dir(root):
    (root / "hidden_states").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    data = []
    for i in range(N):
        T = 6 + i
        hs = torch.randn(T, P + 1, H, generator=g)
        ids = torch.randint(0, 384, (T,), generator=g)
        save_file({"hidden_states": hs, "token_ids": ids}, str(root / "hidden_states" / f"hs_{i}.safetensors"))
        data.append((ids, hs))
    return data


def _specforge_dir(root):
    g = torch.Generator().manual_seed(0)
    (root / "rows_0-5000").mkdir(parents=True)
    data = []
    for i in range(N):
        T = 5 + i
        d = {"input_ids": torch.randint(0, 384, (T,), generator=g), "loss_mask": (torch.rand(T, generator=g) > 0.5).long(),
             "hidden_state": torch.randn(1, T, H, generator=g), "aux_hidden_state": torch.randn(1, T, P * H, generator=g)}
        torch.save(d, root / "rows_0-5000" / f"data_{i}.ckpt")
        data.append(d)
    return data


def test_specforge_points_unknown_by_default(tmp_path):
    data = _specforge_dir(tmp_path / "sf")
    r = run_data_import(DataImportConfig(src=tmp_path / "sf", out=tmp_path / "ds", shard_samples=2))
    assert r["format"] == "specforge" and r["points"] == [None, None, None] and r["target_hidden"] == "final_norm"
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert man["points"]["stated_by"] == "unknown" and man["complete"] and len(man["shards"]) == 3
    ds = FeatureDataset(tmp_path / "ds")
    assert len(ds) == N
    s = ds[3]
    assert torch.equal(s["input_ids"], data[3]["input_ids"])
    assert torch.equal(s["loss_mask"], data[3]["loss_mask"].bool())
    assert torch.equal(s["features"], data[3]["aux_hidden_state"].view(-1, P, H))
    assert torch.equal(s["target_hidden"], data[3]["hidden_state"][0])


def test_specforge_points_stated_as_engine_ids(tmp_path):
    _specforge_dir(tmp_path / "sf")
    r = run_data_import(DataImportConfig(src=tmp_path / "sf", out=tmp_path / "ds", layers_from="specforge",
                                         ids=[1, 3, 4], target_layers=8))
    assert r["points"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert man["points"]["vllm"] == [2, 4, 5] and man["points"]["stated_by"] == "user"


def test_speculators_without_target_keeps_prenorm_and_says_so(tmp_path):
    data = _speculators_dir(tmp_path / "sp")
    r = run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds", all_loss=True, target_layers=8))
    assert r["target_hidden"] == "layers.7.out"
    assert any("PRE-norm" in w for w in r["warnings"]) and any("--all-loss" in w for w in r["warnings"])
    s = FeatureDataset(tmp_path / "ds")[2]
    assert torch.equal(s["features"], data[2][1][:, :P]) and torch.equal(s["target_hidden"], data[2][1][:, -1])
    assert bool(s["loss_mask"].all())


def test_speculators_with_target_applies_final_norm(tmp_path):
    from eaglewire.targets.load import load_target

    data = _speculators_dir(tmp_path / "sp")
    r = run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds", all_loss=True, target="tiny:llama",
                                         points=["layers.1.out,layers.3.out,layers.4.out"]))
    assert r["target_hidden"] == "final_norm" and r["points"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    norm = load_target("tiny:llama").model.model.norm
    s = FeatureDataset(tmp_path / "ds")[1]
    with torch.no_grad():
        assert torch.allclose(s["target_hidden"], norm(data[1][1][:, -1]), atol=1e-6)
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert man["target"]["fingerprint"]["num_layers"] == 8 and "unknown" not in man["target"]["fingerprint"]


def test_speculators_without_mask_source_is_refused(tmp_path):
    _speculators_dir(tmp_path / "sp")
    with pytest.raises(EaglewireError, match="loss masks live in an Arrow dataset|no Arrow dataset"):
        run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds"))


def test_wrong_point_count_is_refused(tmp_path):
    _specforge_dir(tmp_path / "sf")
    with pytest.raises(EaglewireError, match="2 points stated but the files hold 3 feature slots"):
        run_data_import(DataImportConfig(src=tmp_path / "sf", out=tmp_path / "ds", points=["layers.1.out", "layers.3.out"],
                                         target_layers=8))


def _truncate(f):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


@pytest.mark.parametrize("damage, words", [
    (lambda f: f.write_bytes(b"garbage" * 9), r"hs_2.safetensors: not a whole safetensors file"),
    (_truncate, r"hs_2.safetensors: not a whole safetensors file"),
    (lambda f: save_file({"hidden_states": torch.zeros(3, 4, H)}, str(f)), r"hs_2.safetensors: no token_ids"),
    (lambda f: save_file({"hidden_states": torch.zeros(3, 4, H), "token_ids": torch.zeros(3)}, str(f)),
     r"hs_2.safetensors: token_ids \[3\] torch.float32 is not \[T\] integers"),
    (lambda f: save_file({"hidden_states": torch.zeros(3, 4, H, dtype=torch.int32), "token_ids": torch.zeros(3).long()},
                         str(f)), r"hs_2.safetensors: hidden_states \[3, 4, 64\] torch.int32 is not"),
    (lambda f: f.rename(f.with_name("hs_x.safetensors")), r"hs_x.safetensors: expected the sample number"),
])
def test_garbage_speculators_files_are_one_line(tmp_path, damage, words):
    _speculators_dir(tmp_path / "sp")
    damage(tmp_path / "sp" / "hidden_states" / "hs_2.safetensors")
    with pytest.raises(EaglewireError, match=words):
        run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds", all_loss=True))
    assert not (tmp_path / "ds" / "manifest.json").exists() or not json.loads(
        (tmp_path / "ds" / "manifest.json").read_text()).get("complete")


@pytest.mark.parametrize("damage, words", [
    (lambda d: d.pop("loss_mask"), "data_1.ckpt: no loss_mask"),
    (lambda d: d.update(hidden_state=torch.randn(1, 3, H)), "data_1.ckpt: .* do not hold 6 tokens"),
    (lambda d: d.update(loss_mask=torch.ones(2)), "data_1.ckpt: .* do not hold 6 tokens"),
    (lambda d: d.update(input_ids=torch.zeros(0).long()), "data_1.ckpt: .* do not hold 0 tokens"),
])
def test_garbage_specforge_files_are_one_line(tmp_path, damage, words):
    data = _specforge_dir(tmp_path / "sf")
    damage(data[1])
    torch.save(data[1], tmp_path / "sf" / "rows_0-5000" / "data_1.ckpt")
    with pytest.raises(EaglewireError, match=words):
        run_data_import(DataImportConfig(src=tmp_path / "sf", out=tmp_path / "ds"))


def test_a_garbage_arrow_dataset_is_one_line(tmp_path):
    pytest.importorskip("pyarrow")
    _speculators_dir(tmp_path / "sp")
    (tmp_path / "sp" / "data-00000-of-00001.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(EaglewireError, match="data-00000-of-00001.arrow: not an Arrow stream with a loss_mask column"):
        run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds"))


def test_files_of_different_shapes_are_one_line(tmp_path):
    _speculators_dir(tmp_path / "sp")
    save_file({"hidden_states": torch.zeros(3, P + 1, H // 2), "token_ids": torch.zeros(3).long()},
              str(tmp_path / "sp" / "hidden_states" / "hs_3.safetensors"))
    with pytest.raises(EaglewireError, match=r"sample 3 holds features \[3, 32\] and a final state of width 32, "
                                             r"the samples before \[3, 64\] and 64"):
        run_data_import(DataImportConfig(src=tmp_path / "sp", out=tmp_path / "ds", all_loss=True))
