"""A checkpoint's config.json: the SGLang export's config when SGLang can serve the drafter, no engine claim otherwise.

The checkpoint doubles as an SGLang/SpecForge layout; if its config were written by
its own code it could claim what `eaglewire export --format sglang` refuses (fc_norm,
norm_before_residual, 4 slots, a point SGLang cannot capture: `null` ids).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.saved.formats import DRAFTER_KEY, NOT_SERVABLE_KEY
from eaglewire.targets.points import Point, eagle3_default, layer_out
from eaglewire_testing.export_helpers import VERIFIER, L, make_ckpt, make_drafter, provenance

ENGINE_CLAIMS = ("architectures", "model_type", "eagle_config", "eagle_aux_hidden_state_layer_ids")


def _config(d) -> dict:
    return json.loads((d / "config.json").read_text())


def _same_weights(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


UNSERVABLE = {
    "fc_norm": (dict(fc_norm=True), None, "fc_norm"),
    "norm_before_residual": (dict(norm_before_residual=True), None, "norm_before_residual"),
    "four_slots": (dict(num_aux=4), ["layers.1.out", "layers.3.out", "layers.4.out", "layers.6.out"], "4 feature slots"),
    "embed_point": ({}, ["embed", "layers.3.out", "layers.7.out"], "no layer id for embed"),
}


@pytest.mark.parametrize("case", list(UNSERVABLE))
def test_unservable_drafter_gets_no_engine_claim_and_still_loads(tmp_path, case):
    kw, names, reason = UNSERVABLE[case]
    pts = None if names is None else [Point.parse(n) for n in names]
    ck, m = make_ckpt(tmp_path / "ck", points=pts, **kw)
    cfg = _config(ck)
    assert not set(ENGINE_CLAIMS) & set(cfg), cfg  # SGLang refuses to load it rather than serve it wrongly
    why = cfg[NOT_SERVABLE_KEY]["sglang"]
    assert why and any(reason in r for r in why), why
    assert cfg[DRAFTER_KEY] == m.config.to_dict()
    m2, prov = load_checkpoint(ck)
    _same_weights(m, m2)
    assert prov.point_names == (names or [p.name for p in eagle3_default(L)])
    # the export refuses for the same reasons the checkpoint records
    with pytest.raises(EaglewireError, match="cannot export to sglang") as e:
        run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    assert all(r in str(e.value) for r in why)
    # importing it would have to guess its ids: refused, naming why
    with pytest.raises(EaglewireError, match="needs no import"):
        run_import(ImportConfig(src=ck, out=tmp_path / "i", target_layers=L))


def test_unservable_checkpoint_is_one_doctor_row_with_the_export_as_fix(tmp_path):
    from eaglewire.doctor.engine_config import doctor_config

    ck, _ = make_ckpt(tmp_path / "ck", fc_norm=True)
    rep = doctor_config(ck, "sglang", L, [p.name for p in eagle3_default(L)], None, None)
    assert [c.name for c in rep.checks] == ["servable"] and rep.failed
    assert "fc_norm" in rep.checks[0].detail and "eaglewire export" in rep.checks[0].fix


def test_servable_checkpoint_config_is_the_sglang_export_cli_config(tmp_path):
    ck, m = make_ckpt(tmp_path / "ck")
    out = tmp_path / "s"
    r = subprocess.run([sys.executable, "-c", "from eaglewire.cli import main; main()", "export", str(ck),
                        "--format", "sglang", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _config(ck) == {**_config(out), DRAFTER_KEY: m.config.to_dict()}
    assert _config(ck)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert NOT_SERVABLE_KEY not in _config(ck)


@pytest.mark.parametrize("model_type", ["llama", "deepseek_v3", None])
@pytest.mark.parametrize("names", [["layers.1.out", "layers.3.out", "layers.4.out"],
                                   ["layers.2.out", "layers.4.out", "layers.5.out"]])
def test_servable_checkpoint_ids_follow_the_recorded_target_like_export(tmp_path, model_type, names):
    """SGLang >= 0.5.13 reads ids differently on DeepSeek-family targets: the checkpoint writes what export writes."""
    m = make_drafter(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    ck = save_checkpoint(tmp_path / "ck", m, provenance(names, L, model_type))
    rec = run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    assert _config(ck) == {**_config(tmp_path / "s"), DRAFTER_KEY: m.config.to_dict()}
    assert _config(ck)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == rec["ids"]
    assert _config(ck)["rope_parameters"]["rope_type"] == "llama3" and _config(ck)["attention_bias"] is False


def test_deepseek_point_sglang_cannot_capture_gets_no_null_ids(tmp_path):
    m = make_drafter()
    pts = [layer_out(0), layer_out(4), layer_out(5)]
    ck = save_checkpoint(tmp_path / "ck", m, provenance(pts, L, "deepseek_v3"))
    cfg = _config(ck)
    assert "eagle_config" not in cfg and any("layers.0.out" in r for r in cfg[NOT_SERVABLE_KEY]["sglang"])
    load_checkpoint(ck)


def _old_style_config(cfg, sglang_ids) -> dict:
    """config.json as checkpoints were written before saved.formats wrote it (the removed hf_config)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size, "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu", "torch_dtype": "float32", "norm_before_residual": cfg.norm_before_residual,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": sglang_ids},
        "eaglewire_drafter_config": cfg.to_dict(),
    }


@pytest.mark.parametrize("kw", [{}, {"fc_norm": True, "norm_before_residual": True}])
def test_old_style_checkpoint_config_still_loads_exports_and_doctors(tmp_path, kw):
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.doctor.records import trained_model_config

    ck, m = make_ckpt(tmp_path / "ck", **kw)
    (ck / "config.json").write_text(json.dumps(_old_style_config(m.config, [1, 3, 4]), indent=2))
    m2, prov = load_checkpoint(ck)
    _same_weights(m, m2)
    assert trained_model_config(ck) == m.config.to_dict()
    rec = run_export(ExportConfig(ckpt=ck, format="speculators" if kw else "sglang", out=tmp_path / "x", verifier=VERIFIER))
    assert rec["ids"] == ([2, 4, 5] if kw else [1, 3, 4])
    if not kw:
        assert not doctor_config(ck, "sglang", L, prov.point_names, None, None, trained_model_config(ck)).failed
