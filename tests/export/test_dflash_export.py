"""`export` and `import` of DFlash drafters: layouts, ids by numbering, refusals, round trips.

References are written by hand from docs/parallel-drafters.md §1-2 (z-lab id k = layers.k.out,
speculators/vLLM id = k + 1), never from the code under test; what the engines themselves read
from these files is executed in test_dflash_conformance.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import DFLASH_KEY, load_dflash_checkpoint
from eaglewire_testing.dflash_export import POINTS, L, make_dflash_ckpt

pytestmark = pytest.mark.unit
VERIFIER = "org/target"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash")
    path, model = make_dflash_ckpt(d / "ckpt")
    return path, model


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory):
    d = tmp_path_factory.mktemp("exports")
    return {f: (d / f, run_export(ExportConfig(ckpt=ckpt[0], format=f, out=d / f, verifier=VERIFIER)))
            for f in ("vllm", "sglang", "speculators")}


def _raw(d):
    return json.loads((d / "config.json").read_text())


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_zlab_export_names_the_layers_in_one_key_only(exported, ckpt, fmt):
    d, res = exported[fmt]
    raw = _raw(d)
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    assert raw["dflash_config"]["target_layer_ids"] == [1, 14, 28]  # the points' own layer numbers
    assert raw["dflash_config"]["mask_token_id"] == 16 and raw["block_size"] == 4 and raw["num_target_layers"] == L
    for key in ("eagle_aux_hidden_state_layer_ids", "target_layer_ids", "eagle_config", "auto_map", DFLASH_KEY):
        assert key not in raw, key
    assert res["ids"] == [1, 14, 28] and "z-lab ids [1, 14, 28] = layers.1/14/28.out" == res["ids_written"]
    saved = ckpt[1].state_dict()
    got = load_file(str(d / "model.safetensors"))
    assert sorted(got) == sorted(saved) and all(torch.equal(got[k], saved[k]) for k in saved)


def test_speculators_export_uses_vllm_numbering_and_block_minus_one_drafts(exported, ckpt):
    d, res = exported["speculators"]
    raw = _raw(d)
    assert raw["speculators_model_type"] == "dflash" and raw["architectures"] == ["DFlashSpeculator"]
    assert raw["aux_hidden_state_layer_ids"] == [2, 15, 29]  # z-lab + 1
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3  # block 4 - 1
    assert raw["block_size"] == 4 and raw["mask_token_id"] == 16 and raw["target_hidden_size"] == 32
    assert raw["draft_vocab_size"] == 50 and raw["transformer_layer_config"]["model_type"] == "qwen3"
    assert raw["speculators_config"]["verifier"]["name_or_path"] == VERIFIER
    assert raw["sliding_window_non_causal"] is True  # else vLLM's update_dflash makes every layer causal
    assert "dflash_config" not in raw and "eagle_aux_hidden_state_layer_ids" not in raw
    assert res["ids_written"] == "speculators/vLLM ids [2, 15, 29] = layers.1/14/28.out"
    assert sorted(load_file(str(d / "model.safetensors"))) == sorted(ckpt[1].state_dict())


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_export_then_import_is_the_identity(exported, ckpt, fmt, tmp_path):
    d, _ = exported[fmt]
    res = run_import(ImportConfig(src=d, out=tmp_path / "back", target_layers=L))
    assert res["points"] == list(POINTS)
    want = {"speculators": "speculators/vLLM ids [2, 15, 29] = layers.1/14/28.out"}.get(
        fmt, "z-lab ids [1, 14, 28] = layers.1/14/28.out")
    assert res["ids_read"] == want
    model, prov = load_dflash_checkpoint(tmp_path / "back")
    assert model.config == ckpt[1].config and prov.point_names == list(POINTS) and prov.num_layers == L
    a, b = ckpt[1].state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _speculators_copy(exported, tmp_path, **edits):
    src = tmp_path / "src"
    shutil.copytree(exported["speculators"][0], src)
    raw = {**_raw(src), **edits}
    (src / "config.json").write_text(json.dumps(raw))
    return src


def test_the_classic_miswiring_is_shown_and_fixed_by_layers_from(exported, tmp_path):
    """z-lab ids written under the speculators key: vLLM feeds one layer shallower everywhere."""
    src = _speculators_copy(exported, tmp_path, aux_hidden_state_layer_ids=[1, 14, 28])
    res = run_import(ImportConfig(src=src, out=tmp_path / "as-is", target_layers=L))
    assert res["points"] == ["layers.0.out", "layers.13.out", "layers.27.out"]
    assert res["ids_read"] == "speculators/vLLM ids [1, 14, 28] = layers.0/13/27.out"
    fixed = run_import(ImportConfig(src=src, out=tmp_path / "fixed", target_layers=L, layers_from="zlab"))
    assert fixed["points"] == list(POINTS) and fixed["engine_source"] == "--layers-from"


def _one_line(fn, *needles):
    with pytest.raises(EaglewireError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_eagle_and_unknown_formats_are_refused(ckpt, tmp_path):
    _one_line(lambda: run_export(ExportConfig(ckpt=ckpt[0], format="eagle", out=tmp_path / "e")), "no DFlash")
    _one_line(lambda: run_export(ExportConfig(ckpt=ckpt[0], format="medusa", out=tmp_path / "m")), "medusa", "gguf")
    assert not (tmp_path / "e").exists() and not (tmp_path / "m").exists()


def test_a_last_layer_drafter_goes_only_where_it_can_be_captured(tmp_path):
    path, _ = make_dflash_ckpt(tmp_path / "last", points=("layers.1.out", "layers.29.out"))
    for fmt in ("sglang", "gguf"):
        _one_line(lambda f=fmt: run_export(ExportConfig(ckpt=path, format=f, out=tmp_path / f)),
                  "layers.29.out", "--format vllm or speculators would serve it")
        assert not (tmp_path / fmt).exists()
    res = run_export(ExportConfig(ckpt=path, format="vllm", out=tmp_path / "v"))
    assert _raw(tmp_path / "v")["dflash_config"]["target_layer_ids"] == [1, 29] and res["engine"] == "vllm"


@pytest.mark.parametrize("edit,needles", [
    ({"eagle_aux_hidden_state_layer_ids": [1, 14, 28]}, ("eagle_aux_hidden_state_layer_ids", "disagree")),
    ({"eagle_config": {"foo": 1}}, ("eagle_config", "target's default")),
    ({"dflash_config": {"mask_token_id": 16}}, ("target_layer_ids", "expected a list")),
    ({"dflash_config": {"mask_token_id": 16, "target_layer_ids": [14, 1, 28]}}, ("target_layer_ids",)),
    ({"dflash_config": {"mask_token_id": 16, "target_layer_ids": [1, 14, 30]}}, ("30", "30 layers")),
])
def test_bad_zlab_configs_are_refused_in_one_line_writing_nothing(exported, tmp_path, edit, needles):
    src = tmp_path / "src"
    shutil.copytree(exported["vllm"][0], src)
    (src / "config.json").write_text(json.dumps({**_raw(src), **edit}))
    _one_line(lambda: run_import(ImportConfig(src=src, out=tmp_path / "out", target_layers=L)), *needles)
    assert not (tmp_path / "out").exists()


def test_import_needs_the_layer_count_and_takes_arch_only_without_target(exported, tmp_path):
    d = exported["vllm"][0]
    _one_line(lambda: run_import(ImportConfig(src=d, out=tmp_path / "a")), "--target-layers")
    _one_line(lambda: run_import(ImportConfig(src=d, out=tmp_path / "b", target="tiny:qwen3", arch="qwen3")),
              "--arch")
    res = run_import(ImportConfig(src=d, out=tmp_path / "c", target_layers=L, arch="qwen3"))
    assert res["points"] == list(POINTS)


def test_import_refuses_a_missing_or_extra_tensor(exported, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(exported["vllm"][0], src)
    sd = load_file(str(src / "model.safetensors"))
    sd.pop("hidden_norm.weight")
    sd["lm_head.weight"] = torch.zeros(2, 2)
    save_file(sd, str(src / "model.safetensors"))
    _one_line(lambda: run_import(ImportConfig(src=src, out=tmp_path / "o", target_layers=L)),
              "hidden_norm.weight", "lm_head.weight")


def test_cli_names_the_numbering_and_refuses_in_one_line(exported, ckpt, tmp_path):
    from eaglewire_testing.cli import run_cli

    r = run_cli("import", exported["vllm"][0], "--out", tmp_path / "z", "--target-layers", L)
    assert r.returncode == 0, r.stderr
    assert "z-lab ids [1, 14, 28] = layers.1/14/28.out" in r.stdout and "dflash_config.target_layer_ids" in r.stdout
    r = run_cli("export", ckpt[0], "--format", "speculators", "--out", tmp_path / "s", "--verifier", VERIFIER)
    assert r.returncode == 0, r.stderr
    assert "speculators/vLLM ids [2, 15, 29] = layers.1/14/28.out in aux_hidden_state_layer_ids" in r.stdout
    r = run_cli("export", ckpt[0], "--format", "eagle", "--out", tmp_path / "e")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "no DFlash" in r.stderr


def test_import_given_the_target_reports_the_points_a_miswired_config_feeds(tmp_path):
    """tiny:qwen3 (8 layers, hidden 64, 384 tokens): z-lab ids [1, 3, 5] under the speculators key."""
    path, _ = make_dflash_ckpt(tmp_path / "ck", points=("layers.1.out", "layers.3.out", "layers.5.out"), num_layers=8,
                               hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=32, vocab_size=384)
    run_export(ExportConfig(ckpt=path, format="speculators", out=tmp_path / "x", verifier=VERIFIER))
    raw = _raw(tmp_path / "x")
    assert raw["aux_hidden_state_layer_ids"] == [2, 4, 6]
    (tmp_path / "x" / "config.json").write_text(json.dumps({**raw, "aux_hidden_state_layer_ids": [1, 3, 5]}))
    res = run_import(ImportConfig(src=tmp_path / "x", out=tmp_path / "back", target="tiny:qwen3"))
    assert res["points"] == ["layers.0.out", "layers.2.out", "layers.4.out"]  # what vLLM would feed
    assert res["ids_read"] == "speculators/vLLM ids [1, 3, 5] = layers.0/2/4.out"
    _, prov = load_dflash_checkpoint(tmp_path / "back")
    assert prov.target.source == "tiny:qwen3" and not prov.fingerprint.unknown and prov.num_layers == 8


def test_import_refuses_a_drafter_that_does_not_fit_the_target(exported, tmp_path):
    _one_line(lambda: run_import(ImportConfig(src=exported["vllm"][0], out=tmp_path / "o", target="tiny:qwen3")),
              "hidden_size 32", "tiny:qwen3")
    assert not (tmp_path / "o").exists()


def test_gguf_refuses_a_target_of_another_vocabulary_before_the_converter(tmp_path):
    """A 50-token drafter against tiny:llama (8 layers, 384 tokens): one line, no GGUF, no converter run."""
    path, _ = make_dflash_ckpt(tmp_path / "ck", points=("layers.1.out", "layers.3.out", "layers.5.out"), num_layers=8)
    _one_line(lambda: run_export(ExportConfig(ckpt=path, format="gguf", out=tmp_path / "g", verifier="tiny:llama")),
              "vocab_size 50", "384")
    assert not (tmp_path / "g").exists()
