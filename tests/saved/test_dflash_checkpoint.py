"""The DFlash checkpoint: bit-exact round trip, z-lab config.json, strict loading with one-line refusals."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import (
    DFLASH_KEY,
    is_dflash_checkpoint,
    load_dflash_checkpoint,
    save_dflash_checkpoint,
    zlab_config,
)
from eaglewire_testing.export_helpers import provenance

pytestmark = pytest.mark.unit

L = 6
CFG = DFlashConfig(hidden_size=32, intermediate_size=48, num_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=8, vocab_size=50, target_layer_ids=(1, 3, 4), mask_token_id=7, block_size=4)
POINTS = ["layers.1.out", "layers.3.out", "layers.4.out"]


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = DFlashDrafter(CFG)
    with torch.no_grad():  # norms start at 1: perturb them so a dropped tensor would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = save_dflash_checkpoint(tmp_path / "run" / "drafter", model, provenance(POINTS, L, "llama"))
    return model, out


def test_round_trip_is_bit_exact_and_reads_through_the_run_dir(saved):
    model, out = saved
    back, prov = load_dflash_checkpoint(out.parent)  # the run dir stands for its drafter/
    assert back.config == CFG and prov.point_names == POINTS
    want, got = model.state_dict(), back.state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert is_dflash_checkpoint(out) and is_dflash_checkpoint(out.parent)


def test_config_is_zlab_layout_without_remote_code(saved):
    _, out = saved
    raw = json.loads((out / "config.json").read_text())
    assert "auto_map" not in raw and raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    # z-lab meaning: id k = layers.k.out, so the ids are the points' layer numbers, independently read
    assert raw["dflash_config"]["target_layer_ids"] == [int(p.split(".")[1]) for p in POINTS]
    assert raw["dflash_config"]["mask_token_id"] == 7 and raw["block_size"] == 4 and raw["num_target_layers"] == L
    assert raw["num_hidden_layers"] == 2 and raw["hidden_size"] == 32 and "transformers_version" not in raw
    assert raw == {**zlab_config(CFG, L), DFLASH_KEY: raw[DFLASH_KEY]}
    assert sorted(load_file(str(out / "model.safetensors"))) == sorted(DFlashDrafter(CFG).state_dict())


def test_eagle3_checkpoint_is_not_dflash(tiny_drafter):
    assert not is_dflash_checkpoint(tiny_drafter[0])


@pytest.mark.parametrize("edit", ["missing", "extra"])
def test_strict_load_refuses_tensor_mismatch(saved, edit):
    _, out = saved
    w = out / "model.safetensors"
    sd = load_file(str(w))
    if edit == "missing":
        sd.pop("layers.1.mlp.up_proj.weight")
    else:
        sd["lm_head.weight"] = torch.zeros(50, 32)
    save_file(sd, str(w))
    with pytest.raises(EaglewireError) as e:
        load_dflash_checkpoint(out)
    msg = str(e.value)
    assert "\n" not in msg and ("layers.1.mlp.up_proj.weight" if edit == "missing" else "lm_head.weight") in msg


@pytest.mark.parametrize("where", ["zlab", "own"])
def test_ids_disagreeing_with_provenance_points_are_refused(saved, where):
    _, out = saved
    p = out / "config.json"
    raw = json.loads(p.read_text())
    shifted = [2, 4, 5]  # the vLLM numbering written into the z-lab key: one layer deeper everywhere
    if where == "zlab":
        raw["dflash_config"]["target_layer_ids"] = shifted
    else:
        raw["dflash_config"]["target_layer_ids"] = shifted
        raw[DFLASH_KEY]["target_layer_ids"] = shifted
    p.write_text(json.dumps(raw))
    with pytest.raises(EaglewireError) as e:
        load_dflash_checkpoint(out)
    assert "\n" not in str(e.value) and "[2, 4, 5]" in str(e.value)


def test_save_refuses_points_that_are_not_the_ids(tmp_path):
    with pytest.raises(EaglewireError, match="target_layer_ids"):
        save_dflash_checkpoint(tmp_path / "d", DFlashDrafter(CFG), provenance(["layers.1.out", "layers.2.out",
                                                                                "layers.4.out"], L))
    assert not (tmp_path / "d").exists()
