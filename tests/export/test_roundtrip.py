"""Export then import: identical tensors and identical draft logits, for every format."""

from __future__ import annotations

import json

import pytest
import torch

from eaglewire.export.config import ExportConfig, ImportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.importer import run_import
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, read_provenance
from eaglewire.targets.points import ids_for_points, parse_points
from eaglewire_testing.export_helpers import VERIFIER, L, draft_logits, make_ckpt

FORMATS = ["sglang", "vllm", "speculators", "eagle"]


def _roundtrip(tmp_path, fmt, ck, **imp):
    run_export(ExportConfig(ckpt=ck, format=fmt, verifier=VERIFIER, out=tmp_path / f"x-{fmt}"))
    res = run_import(ImportConfig(src=tmp_path / f"x-{fmt}", out=tmp_path / f"i-{fmt}", target_layers=L, **imp))
    model, prov = load_checkpoint(tmp_path / f"i-{fmt}")
    return res, model, prov


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert torch.equal(draft_logits(a), draft_logits(b))


@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_default_points(tmp_path, fmt):
    ck, m = make_ckpt(tmp_path / "ck")
    res, m2, prov = _roundtrip(tmp_path, fmt, ck)
    _same(m, m2)
    assert prov.point_names == read_provenance(ck).point_names
    assert prov.fingerprint.unknown and prov.imported["format"] == fmt


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_roundtrip_multilayer_fc_norm_nbr(tmp_path, fmt):
    """Features only some formats express: 2 layers, norm_before_residual, fc_norm (as fc_norm.<i>.weight, the
    nn.ModuleList both vLLM 0.32's llama_eagle3.py and speculators load)."""
    kw = {"num_layers": 2, "norm_before_residual": True, "fc_norm": True}
    ck, m = make_ckpt(tmp_path / "ck", **kw)
    _, m2, _ = _roundtrip(tmp_path, fmt, ck)
    _same(m, m2)
    assert m2.config.norm_before_residual and m2.config.num_layers == 2 and m2.config.fc_norm
    cfg = json.loads((tmp_path / f"x-{fmt}" / "config.json").read_text())
    assert cfg["fc_norm"] is True


@pytest.mark.parametrize("fmt", FORMATS)
def test_norm_before_fc_and_norm_output_round_trip_where_the_format_reads_them(tmp_path, fmt):
    """speculators' recipe norms (vLLM reads both from the top level): exported and read back; SGLang and the
    official layout read neither, so the export refuses, naming them."""
    ck, m = make_ckpt(tmp_path / "ck", norm_before_fc=True, norm_output=True)
    if fmt in ("sglang", "eagle"):
        with pytest.raises(EaglewireError, match="norm_before_fc .*norm_output|norm_output"):
            _roundtrip(tmp_path, fmt, ck)
        return
    _, m2, _ = _roundtrip(tmp_path, fmt, ck)
    _same(m, m2)
    cfg = json.loads((tmp_path / f"x-{fmt}" / "config.json").read_text())
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True
    assert m2.config.norm_before_fc and m2.config.norm_output


def test_custom_points_ids_written_per_engine_meaning(tmp_path):
    pts = parse_points(["layers.2.out", "layers.4.out", "layers.6.out"], L)
    ck, m = make_ckpt(tmp_path / "ck", points=pts)
    for fmt, key, eng in (("sglang", None, "sglang"), ("vllm", "top", "vllm"), ("speculators", "top", "vllm")):
        r = run_export(ExportConfig(ckpt=ck, format=fmt, verifier=VERIFIER, out=tmp_path / fmt))
        cfg = json.loads((tmp_path / fmt / "config.json").read_text())
        got = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] if key is None else cfg["eagle_aux_hidden_state_layer_ids"]
        assert got == r["ids"] == ids_for_points(pts, eng, L)
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["norm_before_residual"] is False
    assert "eagle_aux_hidden_state_layer_ids" not in json.loads((tmp_path / "vllm" / "config.json").read_text())["eagle_config"]
    _, m2, prov = _roundtrip(tmp_path, "vllm", ck)
    assert prov.point_names == [p.name for p in pts]
    _same(m, m2)


def test_eagle_refuses_other_points(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck", points=parse_points(["layers.2.out", "layers.4.out", "layers.6.out"], L))
    with pytest.raises(EaglewireError, match=r"hard-codes HF indices \[2, L//2, L-3\]"):
        run_export(ExportConfig(ckpt=ck, format="eagle", out=tmp_path / "x"))


def test_sglang_refuses_embedding_and_last_layer(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck", points=parse_points(["embed", "layers.3.out", "layers.7.out"], L))
    with pytest.raises(EaglewireError, match=r"sglang 0.5.23 has no layer id for embed, layers.7.out"):
        run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "x"))
    run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "v"))  # vLLM can: ids 0, 4, 8
    assert json.loads((tmp_path / "v" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [0, 4, 8]


def test_refusals_for_unexpressible_architecture(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck", fc_norm=True, norm_before_residual=True)
    for fmt, what in (("sglang", "fc_norm"), ("eagle", "norm_before_residual")):
        with pytest.raises(EaglewireError, match=what):
            run_export(ExportConfig(ckpt=ck, format=fmt, verifier=VERIFIER, out=tmp_path / fmt))


def test_sglang_default_export_has_no_version_warning(tmp_path):
    """L=8 default capture is SGLang ids [1, 3, 4]: every SGLang version reads them the same, on every target."""
    ck, _ = make_ckpt(tmp_path / "ck")
    r = run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    assert r["ids"] == [1, 3, 4] and r["warnings"] == []
    assert r["engine"] == "sglang 0.5.23" and any("assumed 0.5.23" in a for a in r["assumed"])
    rec = json.loads((tmp_path / "s" / "eaglewire.export.json").read_text())
    assert rec["warnings"] == [] and rec["engine"] == "sglang 0.5.23"


def test_sglang_export_for_a_deepseek_target_follows_the_version(tmp_path):
    """The same trained points get other ids for SGLang 0.5.23 on a DeepSeek-family target, and the
    export says how older versions would read them; an id list no version reads right is refused."""
    from eaglewire.saved.checkpoint import save_checkpoint
    from eaglewire.targets.points import layer_out
    from eaglewire_testing.export_helpers import make_drafter, provenance

    def ckpt(d, pts):
        save_checkpoint(d, make_drafter(), provenance(pts, L, "deepseek_v3"))
        return d

    ck = ckpt(tmp_path / "ck", [layer_out(2), layer_out(4), layer_out(5)])
    new = run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "new"))
    old = run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "old", engine_version="0.5.12"))
    assert old["ids"] == [2, 4, 5] and new["ids"] == [3, 5, 6]
    assert new["engine"] == "sglang 0.5.23 (deepseek_v3)"
    assert any("read differently" in w for w in new["warnings"])
    bad = ckpt(tmp_path / "bad", [layer_out(0), layer_out(4), layer_out(5)])
    with pytest.raises(EaglewireError, match="no layer id for layers.0.out"):
        run_export(ExportConfig(ckpt=bad, format="sglang", out=tmp_path / "b"))
    assert run_export(ExportConfig(ckpt=bad, format="sglang", out=tmp_path / "b2", engine_version="0.5.12"))["ids"] == [0, 4, 5]
    # checked with no --engine, each export is read by the engine version it was written for: both pass
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.doctor.records import exported_for

    assert exported_for(tmp_path / "old") == "sglang==0.5.12" and exported_for(tmp_path / "new") == "sglang"
    for d in ("old", "new"):
        rep = doctor_config(tmp_path / d, exported_for(tmp_path / d), L, [p.name for p in (layer_out(2), layer_out(4), layer_out(5))],
                            None, None, None, "deepseek_v3")
        assert not rep.failed, (d, rep)


def test_import_layers_from_overrides_meaning(tmp_path):
    """The same stored ids read under another engine's meaning land one layer off, and it is recorded."""
    ck, _ = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "v"))
    res = run_import(ImportConfig(src=tmp_path / "v", out=tmp_path / "i", target_layers=L, layers_from="sglang"))
    assert res["points"] == ["layers.2.out", "layers.4.out", "layers.5.out"]
    assert res["engine"] == "sglang" and res["engine_source"] == "--layers-from"


def test_import_without_layer_count_is_refused(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "v"))
    with pytest.raises(EaglewireError, match="--target or --target-layers"):
        run_import(ImportConfig(src=tmp_path / "v", out=tmp_path / "i"))


def test_import_with_target_reads_sglang_ids_under_the_targets_architecture(tmp_path):
    """With --target the architecture is known: no 'architecture unknown' assumption is recorded."""
    ck, _ = make_ckpt(tmp_path / "ck", hidden_size=64, target_hidden_size=64, head_dim=16, vocab_size=384)
    run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    res = run_import(ImportConfig(src=tmp_path / "s", out=tmp_path / "i", target="tiny:llama"))
    assert not [a for a in res["assumed"] if "architecture unknown" in a], res["assumed"]
    bare = run_import(ImportConfig(src=tmp_path / "s", out=tmp_path / "j", target_layers=L))
    assert [a for a in bare["assumed"] if "architecture unknown" in a]  # the control: without it, it is said
    assert res["points"] == bare["points"] == read_provenance(ck).point_names
