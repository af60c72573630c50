"""Published drafter shapes at import and in `doctor config`: SpecForge's Kimi-K2.5 layout, an EAGLE-3.1 drafter
(fc_norm, norm_output), a speculators-format Qwen3 drafter; a drafter whose draft layer is not a Llama layer is
refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire_testing.cli import run_cli
from eaglewire_testing.export_helpers import L, make_ckpt

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("arch", ["Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"])
def test_an_mla_drafter_is_refused_by_name_with_the_reason(tmp_path, arch):
    make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=tmp_path / "ck", format="vllm", out=tmp_path / "mla"))
    d = tmp_path / "mla"
    (d / "eaglewire.export.json").unlink()  # another tool's directory
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = [arch]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglewireError, match=rf"{arch}.*MLA.*cannot be imported") as e:
        run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L))
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]  # the same weights under the Llama-layer class import
    (d / "config.json").write_text(json.dumps(cfg))
    assert run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=L))["ids_found"]


# --- published layouts: import and doctor config --------------------------------------------------------------
# Weights-free configs as published (tests/fixtures/released_drafters/SOURCES.md) with tiny random weights made
# here: a tiny checkpoint is exported to the format, and its config.json replaced by the published one, whose
# sizes are shrunk to the tiny weights' (every other key, the ids and the layout kept as published).

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "released_drafters"
SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
         "draft_vocab_size")


def _published(tmp, fmt: str, config: dict, **drafter) -> Path:
    make_ckpt(tmp / "ck", **drafter)
    d = tmp / "published"
    run_export(ExportConfig(ckpt=tmp / "ck", format=fmt, out=d, verifier="org/target"))
    (d / "eaglewire.export.json").unlink()  # another tool's directory
    written = json.loads((d / "config.json").read_text())
    sizes = written.get("transformer_layer_config", written)
    view = config.get("transformer_layer_config", config)
    view.update({k: sizes[k] for k in SIZES if k in sizes}, bos_token_id=None, eos_token_id=None)
    config.update({k: written[k] for k in ("draft_vocab_size", "target_hidden_size") if k in written})
    (d / "config.json").write_text(json.dumps(config))
    return d


def _kimi() -> dict:
    return json.loads((FIXTURES / "kimi_k25_specforge" / "config.json").read_text())


KIMI_ARGS = ("--arch", "KimiK25ForConditionalGeneration", "--target-layers", "61", "--trained-with", "specforge==0.2.0")
SPECFORGE_020 = ["layers.1.out", "layers.29.out", "layers.57.out"]  # SGLang 0.5.14 on Kimi: id i = output of i-1


@pytest.mark.parametrize("engine,fed,ok", [
    ("sglang==0.5.12", ["layers.2.out", "layers.30.out", "layers.58.out"], False),  # before the +1 on DeepSeek-family
    ("sglang==0.5.23", SPECFORGE_020, True),
    ("vllm==0.32.0", SPECFORGE_020, True),  # ids only under eagle_config: vLLM's default [2, L//2, L-3]
])
def test_doctor_config_says_which_layers_each_engine_feeds_the_kimi_k25_drafter(engine, fed, ok):
    r = run_cli("doctor", "config", FIXTURES / "kimi_k25_specforge", "--engine", engine, *KIMI_ARGS, "--json")
    out = json.loads(r.stdout)
    assert out["fed"] == fed and out["trained"] == SPECFORGE_020
    assert next(c for c in out["checks"] if c["name"] == "points")["ok"] is ok
    assert (r.returncode, out["verdict"]) == ((0, "ok") if ok else (1, "problems"))


def test_the_specforge_kimi_k25_drafter_imports_with_its_ids_read_on_kimi(tmp_path):
    # tiny:kimi_k25's vocabulary: 384 tiktoken ranks + Kimi's 256 reserved special ids
    d = _published(tmp_path, "sglang", _kimi(), hidden_size=64, target_hidden_size=64, vocab_size=640,
                   draft_vocab_size=100, num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    out = run_import(ImportConfig(src=d, out=tmp_path / "imp", target="tiny:kimi_k25"))
    assert out["ids_found"] == [2, 30, 58] and out["points"] == SPECFORGE_020 and out["target_num_layers"] == 61
    model, _ = load_checkpoint(tmp_path / "imp")
    assert (model.config.draft_vocab_size, model.config.num_aux, model.config.hidden_size) == (100, 3, 64)


def _eagle31(tmp, **edit) -> Path:
    """An EAGLE-3.1 drafter in vLLM's layout: per-slot fc_norm and norm_output, as vLLM 0.32.0's llama_eagle3.py
    reads them (config flags `fc_norm`, `norm_output`; weights fc_norm.<i>.weight), ids [1, 29, 57] top level."""
    make_ckpt(tmp / "ck", fc_norm=True, norm_output=True)
    d = tmp / "published"
    run_export(ExportConfig(ckpt=tmp / "ck", format="vllm", out=d))
    (d / "eaglewire.export.json").unlink()
    cfg = {**json.loads((d / "config.json").read_text()), "eagle_aux_hidden_state_layer_ids": [1, 29, 57], **edit}
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return d


def test_an_eagle31_drafter_keeps_its_fc_norms_and_norm_output(tmp_path):
    from safetensors.torch import load_file

    d = _eagle31(tmp_path)
    out = run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=61))
    assert out["points"] == ["layers.0.out", "layers.28.out", "layers.56.out"]  # vLLM: id i = output of i-1
    model, _ = load_checkpoint(tmp_path / "imp")
    assert model.config.fc_norm and model.config.norm_output
    published = load_file(str(d / "model.safetensors"))
    torch.testing.assert_close(model.state_dict()["fc_norm.weight"],
                               torch.cat([published[f"fc_norm.{i}.weight"] for i in range(3)]))


@pytest.mark.parametrize("edit,words", [({"fc_norm": None}, "fc_norm is not true"),
                                        ({"fc_norm": True, "drop": True}, "no fc_norm.<i>.weight")])
def test_fc_norm_flag_and_weights_that_disagree_are_refused(tmp_path, edit, words):
    from safetensors.torch import load_file, save_file

    d = _eagle31(tmp_path, **{k: v for k, v in edit.items() if k != "drop"})
    if edit.get("drop"):
        sd = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if not k.startswith("fc_norm.")}
        save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(EaglewireError, match=words) as e:
        run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=61))
    assert "\n" not in str(e.value) and not (tmp_path / "imp").exists()


def test_a_speculators_qwen3_drafter_imports_and_doctor_reads_it_for_vllm(tmp_path):
    d = _published(tmp_path, "speculators", json.loads((FIXTURES / "qwen3_speculators" / "config.json").read_text()))
    out = run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=36))
    assert out["format"] == "speculators" and out["ids_found"] == [2, 18, 33]
    assert out["points"] == ["layers.1.out", "layers.17.out", "layers.32.out"]
    r = run_cli("doctor", "config", d, "--engine", "vllm", "--target-layers", "36", "--arch", "Qwen3ForCausalLM",
                "--trained-points", ",".join(out["points"]), "--json")
    res = json.loads(r.stdout)
    assert res["fed"] == out["points"] and r.returncode == 0, r.stdout


@pytest.mark.parametrize("arch,points", [
    ("KimiK25ForConditionalGeneration", SPECFORGE_020),  # SGLang 0.5.14 on Kimi: the first-id +1 family rule
    ("", ["layers.2.out", "layers.30.out", "layers.58.out"]),  # no class given: the classic SGLang reading
])
def test_the_kimi_k25_drafter_imports_without_the_target_given_its_class(tmp_path, arch, points):
    """The seeds' case with configs alone: a 1T target is not at hand, so `--target-layers 61 --arch` say what
    SGLang dispatches on, and [2, 30, 58] from SpecForge 0.2.0 (SGLang 0.5.14) read as layers 1/29/57."""
    from safetensors.torch import load_file, save_file

    d = _published(tmp_path, "sglang", _kimi(), hidden_size=64, target_hidden_size=64, vocab_size=384,
                   draft_vocab_size=100, num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    w = next(d.glob("*.safetensors"))
    sd = load_file(w)
    sd.setdefault("embed_tokens.weight", torch.randn(384, 64))
    save_file(sd, w)
    out = run_import(ImportConfig(src=d, out=tmp_path / "imp", target_layers=61, arch=arch,
                                  layers_from="sglang==0.5.14"))
    assert out["ids_found"] == [2, 30, 58] and out["points"] == points


def test_arch_with_a_target_is_refused_in_one_line(tmp_path):
    d = _published(tmp_path, "sglang", _kimi(), hidden_size=64, target_hidden_size=64, vocab_size=384,
                   draft_vocab_size=100, num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    with pytest.raises(EaglewireError, match="--arch is for --target-layers alone"):
        run_import(ImportConfig(src=d, out=tmp_path / "imp", target="tiny:kimi_k25", arch="deepseek_v3"))
    assert not (tmp_path / "imp").exists()
