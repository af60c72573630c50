"""`doctor config` on P-EAGLE exports: the EAGLE-3 rows plus what vLLM 0.32.0 reads for parallel drafting, with
miswired negative controls.

References: vLLM 0.32.0's own `_init_parallel_drafting_params` and `update_peagle`, compiled from the pinned wheel
(the mask id each config gives, or the refusal), and the hand facts of docs/parallel-drafters.md section 8: the
speculators `peagle` type turns on parallel drafting (`eagle3` drafts a chain), `mask_hidden` is loaded into a
[1, fc inputs] buffer (missing: refused), the layer ids are EAGLE-3's (vLLM id k = layers.k-1.out).
"""

from __future__ import annotations

import ast
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from eaglewire.doctor.commands import config_report
from eaglewire.doctor.config import DoctorEngineConfig
from eaglewire.doctor.peagle_config import vllm_reads_mask
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.cli import run_cli
from eaglewire_testing.engine_code import compile_function, sources, wheel
from eaglewire_testing.export_helpers import L, make_drafter, provenance

pytestmark = pytest.mark.unit

MASK = 96  # the trained mask token (the tiny vocabulary has 97 ids)
TRAINED = [p.name for p in eagle3_default(L)]  # layers.1/3/4.out: vLLM ids [2, 4, 5]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One P-EAGLE checkpoint (4 depths) and one plain EAGLE-3 one, exported once: {name: directory}."""
    root = tmp_path_factory.mktemp("peagle_doctor")
    e3 = make_drafter(0)
    m = PEagleDrafter(e3.config, MASK)
    m.load_state_dict({**e3.state_dict(), "mask_hidden": torch.randn(1, 1, e3.fc.in_features)}, strict=True)
    pe = save_checkpoint(root / "peagle", m.eval(), provenance(TRAINED, L), depths=4)
    plain = save_checkpoint(root / "eagle3", e3, provenance(TRAINED, L))
    out = {}
    for name, ckpt, fmt in (("vllm", pe, "vllm"), ("speculators", pe, "speculators"), ("plain", plain, "vllm")):
        run_export(ExportConfig(ckpt=ckpt, format=fmt, out=root / name, verifier="org/target"))
        out[name] = root / name
    return out


def _copy(exports, name, tmp_path, edit=None, tensors=None):
    """A copy of an export with config.json edited in place by `edit(cfg)` and the weights by `tensors(t)`."""
    d = tmp_path / name
    shutil.copytree(exports[name], d)
    if edit:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = load_file(str(d / "model.safetensors"))
        tensors(t)
        save_file(t, str(d / "model.safetensors"))
    return d


def _doc(d, engine=""):
    rep = config_report(DoctorEngineConfig(drafter_dir=d, engine=engine))
    return rep, {c.name: c for c in rep.checks}


@pytest.mark.parametrize("name", ["vllm", "speculators"])
def test_a_correct_export_is_ok(exports, name):
    """Before: `tensors` FAIL (mask_hidden unknown) on both, `eagle3 head` FAIL on speculators_model_type 'peagle'."""
    rep, rows = _doc(exports[name])
    assert rep.exit_code() == 0, rep.to_dict()
    assert rep.data["kind"] == "p-eagle" and rep.data["fed"] == TRAINED
    assert rows["parallel drafting"].ok and rows["mask token"].ok and rows["mask_hidden"].ok
    assert f"mask_token_id = {MASK}" in rows["mask token"].detail


def test_a_plain_eagle3_export_gets_no_peagle_rows(exports):
    rep, rows = _doc(exports["plain"])
    assert rep.exit_code() == 0 and "kind" not in rep.data
    assert not {"parallel drafting", "mask token", "mask_hidden"} & set(rows)


def test_speculators_eagle3_type_is_served_as_a_chain(exports, tmp_path):
    """parallel_drafting off: vLLM's build_vllm_speculative_config gives method eagle3 without it."""
    d = _copy(exports, "speculators", tmp_path, lambda c: c.update(speculators_model_type="eagle3"))
    rep, rows = _doc(d)
    assert rep.exit_code() == 1
    row = rows["parallel drafting"]
    assert not row.ok and "as a chain" in row.detail and '"speculators_model_type": "peagle"' in row.fix


@pytest.mark.parametrize("name", ["vllm", "speculators"])
def test_another_mask_id_than_trained_fails_with_the_trained_id(exports, tmp_path, name):
    d = _copy(exports, name, tmp_path, lambda c: c.update(mask_token_id=5))
    rep, rows = _doc(d)
    assert rep.exit_code() == 1
    row = rows["mask token"]
    assert not row.ok and "mask_token_id = 5" in row.detail and f"trained with mask token {MASK}" in row.detail
    assert row.fix == f'set "mask_token_id": {MASK}'


def test_a_nested_mask_id_shadows_the_top_level_one_in_speculators(exports, tmp_path):
    """update_peagle's pard_token comes after transformer_layer_config.mask_token_id in vLLM's lookup order."""
    d = _copy(exports, "speculators", tmp_path, lambda c: c["transformer_layer_config"].update(mask_token_id=7))
    rep, rows = _doc(d)
    row = rows["mask token"]
    assert rep.exit_code() == 1 and "transformer_layer_config.mask_token_id = 7" in row.detail
    assert "remove it" in row.fix


def test_no_mask_id_is_the_start_refusal(exports, tmp_path):
    d = _copy(exports, "vllm", tmp_path, lambda c: c.pop("mask_token_id"))
    rep, rows = _doc(d)
    assert rep.exit_code() == 1 and "refuses to start" in rows["mask token"].detail
    assert rows["mask token"].fix.startswith(f'set "mask_token_id": {MASK}')


@pytest.mark.parametrize("bad, why", [(None, "no mask_hidden tensor"), (torch.zeros(1, 1, 64), "64 values")])
def test_mask_hidden_missing_or_of_another_width_fails(exports, tmp_path, bad, why):
    def tensors(t):
        t.pop("mask_hidden")
        if bad is not None:
            t["mask_hidden"] = bad

    rep, rows = _doc(_copy(exports, "vllm", tmp_path, tensors=tensors))
    assert rep.exit_code() == 1 and not rows["mask_hidden"].ok and why in rows["mask_hidden"].detail


def test_ids_of_other_layers_are_miswired(exports, tmp_path):
    """The hf-meaning ids [1, 3, 4] written for vLLM: every slot one layer shallower; the P-EAGLE rows still pass."""
    d = _copy(exports, "vllm", tmp_path, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 4]))
    rep, rows = _doc(d)
    assert rep.exit_code() == 1 and rep.data["fed"] == ["layers.0.out", "layers.2.out", "layers.3.out"]
    assert not rows["points"].ok and '"eagle_aux_hidden_state_layer_ids": [2, 4, 5]' in rows["points"].fix
    assert rows["mask token"].ok and rows["mask_hidden"].ok


def test_more_drafts_than_trained_depths_warn(exports, tmp_path):
    def edit(c):
        c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 6

    rep, rows = _doc(_copy(exports, "speculators", tmp_path, edit))
    assert rep.exit_code() == 0 and rows["drafts per round"].level == "warning"
    assert '"speculative_tokens": 4' in rows["drafts per round"].fix


def test_sglang_has_no_peagle(exports):
    rep, rows = _doc(exports["vllm"], engine="sglang")
    assert rep.exit_code() == 1 and "SGLang 0.5.23 has no P-EAGLE" in rows["parallel drafting"].detail


def _vllm_mask(cfg: dict, fns: dict):
    """The id vLLM 0.32.0's V1 proposer puts in the mask slots (its own code), or its refusal's first words."""
    if "speculators_model_type" in cfg:
        pre = json.loads(json.dumps(cfg["transformer_layer_config"]))
        try:
            fns["update_peagle"](cfg, pre)
        except KeyError:
            return "refused"
    else:
        pre = dict(cfg)
    hf = AutoConfig.for_model(**{k: v for k, v in pre.items() if k != "architectures"})
    s = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf), pass_hidden_states_to_model=True,
                        hidden_size=8, dtype=torch.float32, device="cpu")
    try:
        fns["_init_parallel_drafting_params"](s)
    except ValueError:
        return "refused"
    return s.parallel_drafting_token_id


@pytest.mark.integration  # vLLM's own code, from its wheel
def test_the_mask_id_read_is_vllms(exports):
    """vllm_reads_mask against vLLM's proposer and update_peagle, executed on each layout and key order."""
    want = {"vllm/v1/spec_decode/llm_base_proposer.py": "_init_parallel_drafting_params",
            "vllm/transformers_utils/configs/speculators/algos.py": "update_peagle"}
    whl, fns = wheel("vllm"), {}
    for path, name in want.items():
        src = sources(whl, path)[path]
        fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == name)
        fns[name] = compile_function(src, path, fn, {"torch": torch})
    base = {n: json.loads((exports[n] / "config.json").read_text()) for n in ("vllm", "speculators")}
    cases = [("vllm", {}), ("vllm", {"mask_token_id": None}), ("vllm", {"pard_token": 3}),
             ("vllm", {"dflash_config": {"mask_token_id": 4}}), ("vllm", {"mask_token_id": None, "ptd_token_id": 6}),
             ("speculators", {}), ("speculators", {"transformer_layer_config": {"mask_token_id": 7}}),
             ("speculators", {"transformer_layer_config": {"dspark_noise_token_id": 8}})]
    for name, top in cases:
        cfg = json.loads(json.dumps(base[name]))
        for k, v in top.items():
            if k == "transformer_layer_config":
                cfg[k].update(v)
            else:
                cfg[k] = v
        cfg = {k: v for k, v in cfg.items() if v is not None}
        key, ours = vllm_reads_mask(cfg)
        assert (ours if key is not None else "refused") == _vllm_mask(cfg, fns), (name, top, key)
    no_mask = {k: v for k, v in base["speculators"].items() if k != "mask_token_id"}
    assert vllm_reads_mask(no_mask) == (None, None) and _vllm_mask(no_mask, fns) == "refused"


@pytest.mark.parametrize("key, bad", [("speculators_config", {"proposal_methods": {"a": 1}}),
                                      ("speculators_config", [1]), ("transformer_layer_config", [1])])
def test_a_malformed_speculators_section_is_a_row_never_a_traceback(exports, tmp_path, key, bad):
    d = _copy(exports, "speculators", tmp_path, lambda c: c.update({key: bad}))
    rep, rows = _doc(d)
    assert "parallel drafting" in rows and "mask token" in rows, rep.to_dict()


def test_doctor_drafter_refuses_a_peagle_checkpoint_in_one_line(exports):
    """Its EAGLE-3 chain replay would report what vLLM serves without parallel_drafting, as if it were the drafter's."""
    r = run_cli("doctor", "drafter", str(exports["vllm"].parent / "peagle"), "--data", str(exports["vllm"]))
    assert r.returncode == 2 and "a P-EAGLE drafter; `doctor drafter` replays EAGLE-3 chains" in r.stderr, r.stderr
