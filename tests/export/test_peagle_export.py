"""`eaglewire export` of a P-EAGLE checkpoint: the EAGLE-3 export of the same weights plus mask_hidden and the
mask token id (vllm), the speculators 'peagle' layout, and one-line refusals for the formats that have no P-EAGLE."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.cli import run_cli
from eaglewire_testing.export_helpers import L, make_drafter, provenance

pytestmark = pytest.mark.unit


def _ckpts(root):
    from eaglewire.drafter.peagle import PEagleDrafter

    e3 = make_drafter(0)
    m = PEagleDrafter(e3.config, 96)
    mask = torch.randn(1, 1, e3.fc.in_features)
    m.load_state_dict({**e3.state_dict(), "mask_hidden": mask}, strict=True)
    names = [p.name for p in eagle3_default(L)]
    pe = save_checkpoint(root / "peagle", m.eval(), provenance(names, L), depths=4)
    plain = save_checkpoint(root / "eagle3", e3, provenance(names, L))
    return pe, plain, mask


def _export(ckpt, fmt, out, *extra):
    return run_cli("export", ckpt, "--format", fmt, "--out", out, "--verifier", "org/target", "--json", *extra)


def _written(out):
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


def test_vllm_layout_is_eagle3_plus_mask(tmp_path):
    pe, plain, mask = _ckpts(tmp_path)
    r = _export(pe, "vllm", tmp_path / "pv")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["kind"] == "p-eagle" and rec["parallel_drafting"] is True and rec["mask_token_id"] == 96
    assert _export(plain, "vllm", tmp_path / "ev").returncode == 0
    (pc, pt), (ec, et) = _written(tmp_path / "pv"), _written(tmp_path / "ev")
    assert pc.pop("mask_token_id") == 96 and pc == ec
    assert set(pt) == set(et) | {"mask_hidden"} and torch.equal(pt["mask_hidden"], mask)
    assert all(torch.equal(pt[k], et[k]) for k in et)


def test_speculators_layout_is_peagle(tmp_path):
    pe, _, mask = _ckpts(tmp_path)
    for extra, k in (((), 4), (("--depth", "2"), 2)):  # the trained depths unless --depth says otherwise
        out = tmp_path / f"s{k}"
        r = _export(pe, "speculators", out, *extra)
        assert r.returncode == 0, r.stderr
        c, t = _written(out)
        assert c["speculators_model_type"] == "peagle" and c["architectures"] == ["PEagleSpeculator"]
        assert c["mask_token_id"] == 96 and c["speculators_config"]["algorithm"] == "peagle"
        assert c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == k
        assert torch.equal(t["mask_hidden"], mask)


@pytest.mark.parametrize("fmt,why", [("sglang", "SGLang 0.5.23 has no P-EAGLE"), ("specforge", "SGLang"),
                                     ("eagle", "drafts sequentially"), ("gguf", "llama.cpp has no P-EAGLE"),
                                     ("llama.cpp", "llama.cpp has no P-EAGLE")])
def test_formats_without_peagle_are_refused(tmp_path, fmt, why):
    pe, _, _ = _ckpts(tmp_path)
    out = tmp_path / "out"
    r = _export(pe, fmt, out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "exports to vllm or speculators only" in r.stderr and why in r.stderr, r.stderr
    assert not out.exists()


def test_depth_left_at_its_default_keeps_the_trained_depths_and_a_given_3_is_kept(tmp_path):
    """No --depth: the 4 depths the drafter was trained for (as `serve --depth 0` does); --depth 3 given on
    purpose (the EAGLE-3 default's value) is 3, not read as "not given"; an EAGLE-3 drafter keeps 3."""
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export

    pe, plain, _ = _ckpts(tmp_path)
    for ckpt, given, k in ((pe, {}, 4), (pe, {"depth": 3}, 3), (plain, {}, 3)):
        out = tmp_path / f"{ckpt.name}-{k}"
        rec = run_export(ExportConfig(ckpt=ckpt, format="speculators", out=out, verifier="org/target", **given))
        c, _ = _written(out)
        assert c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == k, (ckpt.name, given)
        assert rec.get("depth", k) == k
