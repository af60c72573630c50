"""`doctor config` on DFlash drafters: each engine's key and meaning, negative controls that must be MISWIRED.

The reference is a hand table from docs/parallel-drafters.md section 2 (the ids as each engine's pinned source
reads them; vLLM's reader is also executed against `vllm_reads_dflash` in tests/export/test_dflash_conformance.py):
z-lab `dflash_config.target_layer_ids` id k = layers.k.out (SGLang as is, vLLM +1); vLLM top-level
`eagle_aux_hidden_state_layer_ids` and speculators `aux_hidden_state_layer_ids` id k = layers.k-1.out, read by vLLM
before dflash_config; GGUF `dflash.target_layers` id k = layers.k-1.out. The default target has 30 layers and
its DFlash drafter is trained on layers.1/14/28.out (z-lab ids [1, 14, 28]).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from safetensors.torch import save_file

from eaglewire.doctor.engine_config import doctor_config
from eaglewire.drafter.dflash import DFlashConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import zlab_config
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

L = 30
TRAINED = ["layers.1.out", "layers.14.out", "layers.28.out"]
ONE_DEEPER = ["layers.2.out", "layers.15.out", "layers.29.out"]
ONE_SHALLOWER = ["layers.0.out", "layers.13.out", "layers.27.out"]
CFG = DFlashConfig(hidden_size=64, intermediate_size=128, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, vocab_size=100, target_layer_ids=(1, 14, 28), mask_token_id=16, block_size=4)
ZLAB_FIX = 'set "dflash_config": {"target_layer_ids": [1, 14, 28]}'


def _dir(tmp_path, name="d", ids=(1, 14, 28), fc_in=None, **top):
    """A z-lab config.json with these dflash_config ids (None: no dflash_config ids) and extra top-level keys."""
    d = tmp_path / name
    d.mkdir()
    cfg = zlab_config(CFG, L)
    if ids is None:
        del cfg["dflash_config"]["target_layer_ids"]
    else:
        cfg["dflash_config"]["target_layer_ids"] = list(ids)
    cfg.update(top)
    (d / "config.json").write_text(json.dumps(cfg))
    if fc_in is not None:
        save_file({"fc.weight": torch.zeros(64, fc_in)}, str(d / "model.safetensors"))
    return d


def _doc(d, engine, trained=TRAINED):
    rep = doctor_config(d, engine, L, trained, None, None)
    return rep, {c.name: c for c in rep.checks}


# (engine, fed points) per config: the hand table from section 2
CORRECT = {"vllm": TRAINED, "sglang": TRAINED, "speculators": TRAINED}


@pytest.mark.parametrize("engine", sorted(CORRECT))
def test_a_correct_zlab_export_is_ok_on_every_engine(tmp_path, engine):
    """Before: `eagle3 head` FAIL (architectures DFlashDraftModel) and vLLM's default (2, 15, 27) read as fed."""
    rep, rows = _doc(_dir(tmp_path, fc_in=3 * 64), engine)
    assert rep.exit_code() == 0, rep.to_dict()
    assert rep.data["fed"] == CORRECT[engine] and rep.data["wiring"] == "OK"
    assert rows["fc"].ok and "eagle3 head" not in rows


@pytest.mark.parametrize("engine, fed, key", [
    ("vllm", ONE_DEEPER, "dflash_config.target_layer_ids"),
    ("speculators", ONE_DEEPER, "dflash_config.target_layer_ids"),
])
def test_speculators_ids_in_the_zlab_key_are_miswired_with_the_zlab_fix(tmp_path, engine, fed, key):
    """The +1 confusion: [2, 15, 29] (speculators ids) written into dflash_config for a drafter trained on
    layers.1/14/28.out: every slot one layer deeper, and the fix names the z-lab ids."""
    rep, rows = _doc(_dir(tmp_path, ids=(2, 15, 29)), engine)
    assert rep.exit_code() == 1 and rep.data["wiring"] == "MISWIRED"
    assert rep.data["key"] == key and rep.data["ids"] == [2, 15, 29] and rep.data["fed"] == fed
    assert rows["points"].detail.startswith("MISWIRED") and ZLAB_FIX in rows["points"].fix


def test_speculators_ids_in_the_zlab_key_ask_sglang_for_a_layer_it_cannot_capture(tmp_path):
    """SGLang captures layers.0..28.out of a 30-layer target: id 29 asks for the last layer's output."""
    rep, rows = _doc(_dir(tmp_path, ids=(2, 15, 29)), "sglang")
    assert rep.exit_code() == 1 and rep.data["wiring"] == "MISWIRED"
    assert not rows["ids capturable"].ok and "layers.29.out" in rows["ids capturable"].detail
    assert ZLAB_FIX in rows["points"].fix


def test_both_keys_in_two_meanings_are_miswired_for_vllm_only(tmp_path):
    """z-lab ids copied into vLLM's top-level key: vLLM reads it first (one layer shallower), SGLang ignores it."""
    d = _dir(tmp_path, eagle_aux_hidden_state_layer_ids=[1, 14, 28])
    rep, rows = _doc(d, "vllm")
    assert rep.exit_code() == 1 and rep.data["fed"] == ONE_SHALLOWER
    assert rep.data["key"] == "eagle_aux_hidden_state_layer_ids"
    assert ZLAB_FIX in rows["points"].fix and "remove eagle_aux_hidden_state_layer_ids" in rows["points"].fix
    assert not rows["key relation"].ok
    rep, rows = _doc(d, "sglang")
    assert rep.exit_code() == 0 and rep.data["fed"] == TRAINED and "key relation" not in rows


def test_both_keys_in_the_speculators_relation_are_ok(tmp_path):
    """What speculators' update_dflash writes: eagle = z-lab + 1, the same points for every reader."""
    rep, rows = _doc(_dir(tmp_path, eagle_aux_hidden_state_layer_ids=[2, 15, 29]), "vllm")
    assert rep.exit_code() == 0 and rep.data["fed"] == TRAINED and rows["key relation"].ok


def test_an_eagle_config_dict_replaces_the_dflash_ids_in_vllm(tmp_path):
    """vLLM 0.32's runner: an eagle_config dict without the key leaves no ids: the target's EAGLE-3 default."""
    rep, rows = _doc(_dir(tmp_path, eagle_config={"use_aux_hidden_state": True}), "vllm")
    assert rep.exit_code() == 1 and rep.data["fed"] == ["layers.1.out", "layers.14.out", "layers.26.out"]
    assert "remove eagle_config" in rows["points"].fix


@pytest.mark.parametrize("engine, top, ids", [
    ("vllm", {"eagle_aux_hidden_state_layer_ids": [0, 14, 28]}, (1, 14, 28)),  # vLLM id 0 = embed
    ("vllm", {}, (-1, 14, 28)),  # z-lab id -1 = embed (vLLM reads 0)
    ("sglang", {}, (-1, 14, 28)),
])
def test_embed_is_impossible(tmp_path, engine, top, ids):
    rep, rows = _doc(_dir(tmp_path, ids=ids, **top), engine)
    assert rep.exit_code() == 1 and not rows["ids capturable"].ok and "embed" in rows["ids capturable"].detail


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_final_norm_is_impossible_to_feed(tmp_path, engine):
    d = _gguf(tmp_path, [2, 15, 29]) if engine == "llama.cpp" else _dir(tmp_path)
    rep, rows = _doc(d, engine, trained=["layers.1.out", "layers.14.out", "final_norm"])
    assert rep.exit_code() == 1 and rep.data["wiring"] == "MISWIRED"
    assert "final_norm" in rows["points"].fix and "for a DFlash drafter" in rows["points"].fix


def test_a_speculators_layout_is_read_in_its_own_meaning(tmp_path):
    d = tmp_path / "spec"
    d.mkdir()
    cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"], "aux_hidden_state_layer_ids":
           [1, 14, 28], "block_size": 4, "mask_token_id": 16}
    (d / "config.json").write_text(json.dumps(cfg))
    rep, rows = _doc(d, "vllm")
    assert rep.data["key"] == "aux_hidden_state_layer_ids" and rep.data["fed"] == ONE_SHALLOWER
    assert 'set "aux_hidden_state_layer_ids": [2, 15, 29]' in rows["points"].fix
    cfg["aux_hidden_state_layer_ids"] = [2, 15, 29]
    (d / "config.json").write_text(json.dumps(cfg))
    assert _doc(d, "speculators")[0].exit_code() == 0


def _gguf(tmp_path, target_layers):
    d = tmp_path / "g"
    d.mkdir()
    w = GGUFWriter(str(d / "drafter.gguf"), "dflash")
    w.add_array("dflash.target_layers", target_layers)
    w.add_tensor("fc.weight", np.zeros((4, 12), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d


@pytest.mark.parametrize("layers, fed, ok", [([2, 15, 29], TRAINED, True), ([1, 14, 28], ONE_SHALLOWER, False)])
def test_llamacpp_reads_gguf_target_layers_as_layer_inputs(tmp_path, layers, fed, ok):
    rep, rows = _doc(_gguf(tmp_path, layers), "llama.cpp")
    assert (rep.exit_code() == 0) == ok and rep.data["fed"] == fed and rep.data["key"] == "dflash.target_layers"
    if not ok:
        assert "dflash.target_layers = [2, 15, 29]" in rows["points"].fix


def test_json_carries_what_a_script_reads(tmp_path):
    d = _dir(tmp_path, ids=(2, 15, 29))
    r = run_cli("doctor", "config", d, "--engine", "vllm", "--target-layers", L, "--trained-points",
                ",".join(TRAINED), "--json")
    js = json.loads(r.stdout)
    assert r.returncode == 1 and js["ok"] is False and js["wiring"] == "MISWIRED"
    assert js["engine"] == "vllm 0.32.0" and js["key"] == "dflash_config.target_layer_ids"
    assert js["ids"] == [2, 15, 29] and js["fed"] == ONE_DEEPER and js["trained"] == TRAINED
    assert ZLAB_FIX in js["fix"]


def test_unknown_training_asks_instead_of_deciding(tmp_path):
    rep, _ = _doc(_dir(tmp_path), "sglang", trained=None)
    assert rep.exit_code() == 3 and rep.data["wiring"] == "UNKNOWN" and rep.data["fed"] == TRAINED


def test_a_mask_token_other_than_trained_is_named_with_the_trained_one(tmp_path):
    """Every mask slot's input is the mask embedding: the export record says which one the drafter learned."""
    d = _dir(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"]["mask_token_id"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "eaglewire.export.json").write_text(json.dumps({"mask_token_id": 16}))
    for engine in ("vllm", "sglang"):
        rep, rows = _doc(d, engine)
        assert rep.exit_code() == 1 and rep.data["wiring"] == "OK"
        assert not rows["mask token"].ok and rows["mask token"].fix == 'set "mask_token_id": 16 inside dflash_config'
    (d / "eaglewire.export.json").write_text(json.dumps({"mask_token_id": 3}))
    assert _doc(d, "vllm")[1]["mask token"].ok


def test_the_provenance_beside_a_checkpoint_says_what_it_was_trained_on(tmp_path):
    """No --trained-points: the eaglewire.json of a DFlash checkpoint names the points; ids edited after
    training (the +1 confusion) are MISWIRED, the untouched checkpoint is OK."""
    from eaglewire.drafter.dflash import DFlashDrafter
    from eaglewire.saved.dflash import save_dflash_checkpoint
    from eaglewire_testing.export_helpers import provenance

    ck = save_dflash_checkpoint(tmp_path / "ck", DFlashDrafter(CFG), provenance(CFG.points, L, "llama"))
    args = ("doctor", "config", ck, "--engine", "vllm", "--json")
    js = json.loads(run_cli(*args).stdout)
    assert js["ok"] and js["trained"] == TRAINED and js["fed"] == TRAINED and js["fix"] is None
    cfg = json.loads((ck / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [2, 15, 29]
    (ck / "config.json").write_text(json.dumps(cfg))
    r = run_cli(*args)
    js = json.loads(r.stdout)
    assert r.returncode == 1 and js["wiring"] == "MISWIRED" and js["fed"] == ONE_DEEPER and ZLAB_FIX in js["fix"]


def test_trained_with_reads_the_ids_the_producer_wrote(tmp_path):
    """SpecForge writes the ids it trained on into dflash_config (z-lab meaning); a top-level key in the other
    meaning that vLLM reads first then feeds other layers than SpecForge captured."""
    from eaglewire.targets.producers import Producer

    d = _dir(tmp_path, eagle_aux_hidden_state_layer_ids=[1, 14, 28])
    rep = doctor_config(d, "vllm", L, None, None, None, trained_with=Producer("specforge"))
    assert rep.data["trained"] == TRAINED and rep.data["fed"] == ONE_SHALLOWER and rep.data["wiring"] == "MISWIRED"
    rep = doctor_config(d, "sglang", L, None, None, None, trained_with=Producer("specforge"))
    assert rep.exit_code() == 0 and rep.data["wiring"] == "OK"


@pytest.mark.parametrize("engine", ["vllm", "speculators"])
def test_a_target_class_vllm_cannot_capture_from_fails_for_dflash_too(tmp_path, engine):
    """vLLM's DFlash proposer captures through the EAGLE-3 interface (gpu_model_runner.py: `supports_eagle3` or
    "Model does not support EAGLE3 interface"): Gemma-3 has none, Qwen3 has it."""
    d = _dir(tmp_path, fc_in=3 * 64)
    rep = doctor_config(d, engine, L, TRAINED, None, None, arch="Gemma3ForConditionalGeneration")
    row = next(c for c in rep.checks if c.name == "target class")
    assert rep.exit_code() == 1 and not row.ok and "Gemma3ForConditionalGeneration" in row.detail
    rep = doctor_config(d, engine, L, TRAINED, None, None, arch="Qwen3ForCausalLM")
    assert rep.exit_code() == 0 and "target class" not in {c.name for c in rep.checks}


def test_a_target_graph_without_layer_inputs_fails_a_dflash_gguf(tmp_path):
    """llama.cpp feeds DFlash from `t_layer_inp` as it feeds EAGLE-3: Gemma-3's graph marks none, Qwen3-MoE's does."""
    d = _gguf(tmp_path, [2, 15, 29])
    rep = doctor_config(d, "llama.cpp", L, TRAINED, None, None, arch="Gemma3ForConditionalGeneration")
    row = next(c for c in rep.checks if c.name == "target class")
    assert rep.exit_code() == 1 and "Gemma3ForConditionalGeneration" in row.detail and "llama.cpp" in row.detail
    rep = doctor_config(d, "llama.cpp", L, TRAINED, None, None, arch="Qwen3MoeForCausalLM")
    assert rep.exit_code() == 0, rep.to_dict()


def test_a_pipeline_split_is_refused_rather_than_passed_on_one_stage_meanings(tmp_path):
    """vLLM's DFlash captures through the per-stage loop the EAGLE-3 ids do: the one-stage verdict must not pass a
    split it never read (one stage is unchanged)."""
    d = _dir(tmp_path)
    assert not doctor_config(d, "vllm", L, TRAINED, None, None, arch="LlamaForCausalLM", pp=1).failed
    with pytest.raises(EaglewireError, match="--pipeline-parallel-size 2: the DFlash check"):
        doctor_config(d, "vllm", L, TRAINED, None, None, arch="LlamaForCausalLM", pp=2)
