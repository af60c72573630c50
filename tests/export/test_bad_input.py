"""Broken foreign checkpoints: each gives a precise one-line error, never a silently random weight."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire_testing.export_helpers import L, draft_logits, make_ckpt


@pytest.fixture
def exported(tmp_path):
    ck, m = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    return tmp_path / "s", m


def _edit(d, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


def _imp(d, tmp_path, **kw):
    return run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L, **kw))


def test_missing_tensor(exported, tmp_path):
    d, _ = exported
    _edit(d, lambda sd: sd.pop("midlayer.mlp.up_proj.weight"))
    with pytest.raises(EaglewireError, match=r"missing \['midlayer.mlp.up_proj.weight'\], unexpected none"):
        _imp(d, tmp_path)


def test_extra_tensor(exported, tmp_path):
    d, _ = exported
    _edit(d, lambda sd: sd.__setitem__("midlayer.self_attn.rotary_emb.inv_freq", torch.ones(4)))
    with pytest.raises(EaglewireError, match=r"unexpected \['midlayer.self_attn.rotary_emb.inv_freq'\]"):
        _imp(d, tmp_path)


def test_d2t_absolute_ids_not_offsets(exported, tmp_path):
    d, m = exported
    _edit(d, lambda sd: sd.__setitem__("d2t", m.draft_target_ids().clone()))  # absolute target ids
    with pytest.raises(EaglewireError, match=r"d2t maps draft ids outside the target vocab .*OFFSETS"):
        _imp(d, tmp_path)


def test_shape_disagrees_with_config(exported, tmp_path):
    d, _ = exported
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=r"midlayer.mlp.gate_proj.weight has shape \[64, 32\], config implies \[48, 32\]"):
        _imp(d, tmp_path)


def test_pickle_where_only_safetensors_allowed(exported, tmp_path):
    d, m = exported
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    with pytest.raises(EaglewireError, match=r"pickle weights are read only for the official EAGLE layout"):
        _imp(d, tmp_path)


def test_pickle_disguised_as_safetensors(exported, tmp_path):
    d, m = exported
    torch.save(m.state_dict(), d / "model.safetensors")
    with pytest.raises(EaglewireError, match=r"model.safetensors: cannot read safetensors"):
        _imp(d, tmp_path)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_official_pickle_with_code_is_refused(tmp_path):
    ck, m = make_ckpt(tmp_path / "ck")
    d = tmp_path / "e"
    run_export(ExportConfig(ckpt=ck, format="eagle", out=d))
    sd = load_file(str(d / "model.safetensors"))
    sd["evil"] = _Evil()
    torch.save(sd, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    with pytest.raises(EaglewireError, match=r"weights_only=True\) refused it"):
        _imp(d, tmp_path)


def test_official_pickle_without_embedding_needs_target(tmp_path):
    """The official repo publishes pytorch_model.bin without embed_tokens (read from the target)."""
    kw = dict(hidden_size=64, head_dim=16, intermediate_size=128, target_hidden_size=64, vocab_size=384,
              draft_vocab_size=100)
    ck, m = make_ckpt(tmp_path / "ck", **kw)
    d = tmp_path / "e"
    run_export(ExportConfig(ckpt=ck, format="eagle", out=d))
    sd = load_file(str(d / "model.safetensors"))
    sd.pop("embed_tokens.weight")
    torch.save(sd, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    with pytest.raises(EaglewireError, match="no embed_tokens.weight .* pass --target"):
        _imp(d, tmp_path)
    res = run_import(ImportConfig(src=d, out=tmp_path / "imp2", target="tiny:llama"))
    assert any("copied from target" in s for s in res["inferred"])
    m2, prov = load_checkpoint(tmp_path / "imp2")
    assert prov.num_layers == 8 and not prov.fingerprint.unknown and prov.imported["weights"] == "pytorch_model.bin"
    from eaglewire.targets.load import load_target

    emb = load_target("tiny:llama").model.get_input_embeddings().weight
    assert torch.equal(m2.embed_tokens.weight, emb.float())
    with torch.no_grad():
        m.embed_tokens.weight.copy_(emb)
    assert torch.equal(draft_logits(m), draft_logits(m2))


def test_full_vocab_without_maps_is_identity_assumed(tmp_path):
    ck, m = make_ckpt(tmp_path / "ck", draft_vocab_size=97)
    run_export(ExportConfig(ckpt=ck, format="speculators", out=tmp_path / "s", verifier="org/target"))
    assert "d2t" not in load_file(str(tmp_path / "s" / "model.safetensors"))
    res = _imp(tmp_path / "s", tmp_path)
    assert any("identity" in a for a in res["assumed"])


def test_partial_vocab_without_maps_is_refused(exported, tmp_path):
    d, _ = exported
    _edit(d, lambda sd: (sd.pop("d2t"), sd.pop("t2d")))
    with pytest.raises(EaglewireError, match="no d2t/t2d but draft_vocab_size 40 < vocab_size 97"):
        _imp(d, tmp_path)


@pytest.mark.parametrize("damage,msg", [
    (lambda sd: sd["fc.weight"].view(-1).__setitem__(3, float("nan")), r"fc.weight has 1 non-finite values"),
    (lambda sd: sd.__setitem__("norm.weight", torch.full_like(sd["norm.weight"], float("nan"))), "norm.weight has"),
    (lambda sd: sd.__setitem__("fc.weight", sd["fc.weight"].to(torch.int32)), "fc.weight is int32, expected floating"),
])
def test_nan_and_integer_weights_are_refused_by_import_and_doctor(exported, tmp_path, damage, msg):
    from eaglewire.doctor.engine_config import doctor_config

    d, _ = exported
    _edit(d, damage)
    with pytest.raises(EaglewireError, match=msg):
        _imp(d, tmp_path)
    rep = doctor_config(d, "sglang", L, None, None, None)
    values = next(c for c in rep.checks if c.name == "values")
    assert not values.ok and rep.failed and msg.split(" ")[0].replace("\\", "") in values.detail


@pytest.mark.parametrize("damage,msg", [(lambda sd: sd.pop("norm.weight"), r"missing \['norm.weight'\]"),
                                        (lambda sd: sd.__setitem__("midlayer.extra.weight", torch.ones(2)),
                                         r"unknown \['midlayer.extra.weight'\]")])
def test_doctor_config_names_missing_and_unknown_tensors(exported, damage, msg):
    from eaglewire.doctor.engine_config import doctor_config

    d, _ = exported
    assert not doctor_config(d, "sglang", L, None, None, None).failed  # the intact export passes
    _edit(d, damage)
    rep = doctor_config(d, "sglang", L, None, None, None)
    tensors = next(c for c in rep.checks if c.name == "tensors")
    assert not tensors.ok and rep.failed
    import re

    assert re.search(msg, tensors.detail), tensors.detail


@pytest.mark.parametrize("content,msg", [(b"\xff\xfe garbage", "not valid JSON"), (b"[1, 2]", "expected a JSON object"),
                                         (b'{"hidden_size": "abc"}', "expected a LlamaConfig's numbers")])
def test_import_of_a_garbage_config_is_one_line(exported, tmp_path, content, msg):
    d, _ = exported
    if content.startswith(b"{"):  # a real config with one field of the wrong type
        cfg = json.loads((d / "config.json").read_text())
        cfg["hidden_size"] = "abc"
        content = json.dumps(cfg).encode()
    (d / "config.json").write_bytes(content)
    with pytest.raises(EaglewireError, match=msg):
        _imp(d, tmp_path)


@pytest.mark.parametrize("kind", ["garbage", "directory", "symlink-loop"])
def test_doctor_config_on_unreadable_weights_is_a_verdict(exported, kind):
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire_testing.export_helpers import break_weights

    d, _ = exported
    break_weights(d / "model.safetensors", kind)
    rep = doctor_config(d, "sglang", L, None, None, None)
    weights = next(c for c in rep.checks if c.name == "weights")
    assert not weights.ok and rep.failed and "cannot be read as safetensors" in weights.detail


def _sharded(d, shard_name: str):
    """The export with its weights moved out and an index whose weight_map names `shard_name` for every tensor."""
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").rename(d.parent / "outside.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard_name for k in sd}}))


@pytest.mark.parametrize("name", ["../outside.safetensors", "{abs}"])
def test_a_weight_map_pointing_outside_the_source_is_refused(exported, tmp_path, name):
    d, _ = exported
    (d / "link.safetensors").symlink_to(d.parent / "outside.safetensors")
    _sharded(d, name.format(abs=d.parent / "outside.safetensors"))
    with pytest.raises(EaglewireError, match=r"model.safetensors.index.json: weight_map\['[^']+'\]: .*outside") as e:
        _imp(d, tmp_path)
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()


def test_a_weight_map_naming_a_link_of_the_directory_imports_like_an_hf_cache_snapshot(exported, tmp_path):
    """Snapshots in the HF cache are folders of symlinks into ../../blobs: the names are checked, the links followed."""
    d, _ = exported
    (d / "link.safetensors").symlink_to(d.parent / "outside.safetensors")
    _sharded(d, "link.safetensors")
    assert _imp(d, tmp_path)["out"] == str(tmp_path / "imp")


def test_a_weight_map_inside_the_source_imports(exported, tmp_path):
    d, _ = exported
    _sharded(d, "part-1.safetensors")
    (d.parent / "outside.safetensors").rename(d / "part-1.safetensors")
    assert _imp(d, tmp_path)["out"] == str(tmp_path / "imp")


@pytest.mark.parametrize("edit, msg", [
    (lambda c: c.pop("eagle_config"), r"reads as the eagle format, but .*eaglewire.export.json says eaglewire wrote it "
                                      r"as sglang"),
    (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), r"= \[1, 2, 3\], but .* wrote"),
    (lambda c: c.update(eagle_config="x"), r"eagle_config = x: expected an object"),
])
def test_an_edited_config_that_its_export_record_contradicts_is_refused(exported, tmp_path, edit, msg):
    """Without its ids an SGLang export read as the official layout: another wiring, without a word."""
    d, _ = exported
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=msg) as e:
        _imp(d, tmp_path)
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()
    (d / "eaglewire.export.json").unlink()  # another tool's export: the config alone decides
    if "eagle_config" not in cfg:
        assert _imp(d, tmp_path)["format"] == "eagle"
