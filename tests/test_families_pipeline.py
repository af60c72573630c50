"""Every target family through the whole pipeline, as a user runs it: inspect, data build (in-process),
train, export to every format, doctor config per engine; the parallel drafters (DFlash, P-EAGLE) trained,
exported and checked too.

The expected answers are written out below from the engines' own sources, not computed by eaglewire:
- vLLM 0.32.0 refuses at startup a target class without SupportsEagle3 (v1/worker/gpu_model_runner.py): of
  these families GLM-4-MoE (glm4_moe.py) and Gemma-3 (gemma3_mm.py); SGLang 0.5.23 captures from all of them;
- llama.cpp 0.3.36 feeds an EAGLE-3 drafter only from graphs that mark `t_layer_inp` (src/models/*.cpp):
  qwen3moe, openai-moe, minimax-m2, qwen3next, qwen35; not deepseek2 (Kimi-K2, Kimi-K2.5), deepseek32,
  glm4-moe, llama4, qwen3vl, gemma3;
- the official EAGLE code (SafeAILab/EAGLE, cnets.py) sizes attention as hidden_size // num_heads: a drafter
  on an MLA target takes v_head_dim-wide heads that tile the hidden size (drafter/config.py), so it exports.

The data and the drafter are built once per family (smallest settings that run every stage). llama.cpp's
converter is not run: it refuses every tiny target's tokenizer (its BPE pre-tokenizer hash is not one of
llama.cpp's) after 5-20 s, so for the families llama.cpp can serve the test checks that eaglewire's own
refusals, made before the converter runs, pass.
"""

from __future__ import annotations

import json

import pytest

from eaglewire.targets.tiny_families import SERVED_AS, TEMPLATES
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.integration  # every stage of the CLI on 12 targets: minutes, not a unit test
FAMILIES = sorted(TEMPLATES)
VLLM_CANNOT = {"glm4_moe", "gemma3"}
LLAMA_CPP_CAN = {"gpt_oss", "qwen3_moe", "qwen3_next", "qwen3_5", "minimax_m2"}
LINEAR = {"qwen3_next": ["layers.1.out", "layers.4.out"], "qwen3_5": ["layers.1.out", "layers.4.out"]}
# HF ids [2, L//2, L-3] (the EAGLE-3 default) as the layers whose outputs they are; Kimi-K2.5 keeps its 61 layers
DEFAULT_POINTS = {"kimi_k25": ["layers.1.out", "layers.29.out", "layers.57.out"]}
FORMATS = ("sglang", "vllm", "speculators", "eagle", "gguf")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{family: (inspect JSON, directory, {format: export result})}, built on first use: one data build, one
    training and one export per format each, the CLI called as a user calls it."""
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            d = tmp_path_factory.mktemp(arch)
            r = run_cli("inspect", "--target", f"tiny:{arch}", "--json")
            assert r.returncode == 0, r.stderr
            b = run_cli("data", "build", "--target", f"tiny:{arch}", "--topic-prompts", 2, "--max-new-tokens", 4,
                        "--out", d / "ds", "--device", "cpu")
            assert b.returncode == 0, b.stderr
            t = run_cli("train", "--data", d / "ds", "--out", d / "run", "--max-steps", 1, "--batch-size", 1,
                        "--val-fraction", 0, "--device", "cpu")
            assert t.returncode == 0, t.stderr
            exports = {f: run_cli("export", d / "run" / "drafter", "--format", f, "--out", d / f) for f in FORMATS
                       if f != "gguf" or arch not in LLAMA_CPP_CAN}
            cache[arch] = (json.loads(r.stdout), d, exports)
        return cache[arch]

    return get


def _refusal(r, *words):
    line = r.stderr.strip()
    assert r.returncode == 2 and line.startswith("error: ") and "\n" not in line, r.stderr
    assert "Traceback" not in r.stderr and all(w in line for w in words), line


@pytest.mark.parametrize("arch", FAMILIES)
def test_inspect_names_the_class_each_engine_and_the_linear_points(built, arch):
    info, *_ = built(arch)
    assert info["architecture"] == SERVED_AS[arch]
    vllm, sglang = info["engines"]["vllm 0.32.0"], info["engines"]["sglang 0.5.23"]
    assert sglang == {"support": "yes", "refusal": None}
    assert vllm["support"] == ("no" if arch in VLLM_CANNOT else "yes")
    if arch in VLLM_CANNOT:
        assert SERVED_AS[arch] in vllm["refusal"] and "does not support EAGLE3 interface" in vllm["refusal"]
    linear = [n for n, k in info["layer_types"].items() if k == "linear_attention"]
    assert linear == LINEAR.get(arch, [])


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_export_format_writes_or_refuses_in_one_line(built, arch):
    _, d, exports = built(arch)
    ck = d / "run" / "drafter"
    for fmt in FORMATS:
        r = exports.get(fmt)
        refused = ((fmt in ("vllm", "speculators") and arch in VLLM_CANNOT)
                   or (fmt == "gguf" and arch not in LLAMA_CPP_CAN))
        if refused:
            why = {"vllm": "does not support EAGLE3 interface", "speculators": "does not support EAGLE3 interface",
                   "gguf": "layer input tensor is null"}[fmt]
            _refusal(r, str(ck), why, SERVED_AS[arch])
            assert not (d / fmt).exists()
        elif fmt == "gguf":  # what eaglewire checks before llama.cpp's converter runs (see the module docstring)
            from eaglewire.export.gguf import llama_ids
            from eaglewire.saved.checkpoint import load_checkpoint

            model, prov = load_checkpoint(ck)
            assert llama_ids(model.config, prov.points, prov.num_layers, "ck", prov.fingerprint.arch) == [2, 4, 5]
        else:
            assert r.returncode == 0, r.stderr
            rec = json.loads((d / fmt / "eaglewire.export.json").read_text())
            assert rec["points"] == DEFAULT_POINTS.get(arch, ["layers.1.out", "layers.3.out", "layers.4.out"])


@pytest.mark.parametrize("arch", FAMILIES)
def test_doctor_config_per_engine_names_the_engine_that_cannot_serve(built, arch):
    _, d, _ = built(arch)
    r = run_cli("doctor", "config", d / "sglang", "--engine", "sglang", "--target", f"tiny:{arch}")
    assert r.returncode == 0 and "verdict: OK" in r.stdout, r.stdout + r.stderr
    # vLLM: its own export where there is one, else the SGLang directory served by vLLM
    src = d / ("sglang" if arch in VLLM_CANNOT else "vllm")
    r = run_cli("doctor", "config", src, "--engine", "vllm", "--target", f"tiny:{arch}")
    if arch in VLLM_CANNOT:
        assert r.returncode == 1 and "verdict: problems found" in r.stdout, r.stdout + r.stderr
        line = next(ln for ln in r.stdout.splitlines() if "FAIL  target class" in ln)
        assert "vllm 0.32.0 cannot capture" in line and SERVED_AS[arch] in line
    else:
        assert r.returncode == 0 and "verdict: OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("arch", FAMILIES)
def test_parallel_drafters_train_export_and_check_on_every_family(built, arch, tmp_path, monkeypatch):
    """The family's dataset trains a DFlash and a P-EAGLE drafter too (in process, two steps each); each
    checkpoint records the dataset's capture points, the ones its engines are told to feed it. Both export
    (in process) and `doctor config` reads each export as its engine does: OK; where vLLM cannot capture from the
    target class the export is refused (its DFlash proposer and P-EAGLE's eagle3 both use the EAGLE-3 interface)."""
    from eaglewire.data.manifest import Manifest
    from eaglewire.drafter.peagle import PEagleDrafter
    from eaglewire.saved.checkpoint import load_checkpoint
    from eaglewire.saved.dflash import load_dflash_checkpoint
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train

    _, d, _ = built(arch)
    points = Manifest.load(d / "ds").points
    kw = dict(data=d / "ds", device="cpu", max_steps=2, batch_size=2, max_len=128, val_fraction=0.0)
    run_train(TrainConfig(out=tmp_path / "dflash", drafter="dflash", num_anchors=8, **kw))
    assert load_dflash_checkpoint(tmp_path / "dflash")[1].points == points
    run_train(TrainConfig(out=tmp_path / "peagle", drafter="p-eagle", **kw))
    model, prov = load_checkpoint(tmp_path / "peagle")
    assert isinstance(model, PEagleDrafter) and prov.points == points
    zlab = [q.layer for q in points]  # z-lab id k = layers.k.out; vLLM / speculators / llama.cpp ids k + 1
    _dflash_exports_checked(arch, tmp_path, monkeypatch, zlab)
    _peagle_exports_checked(arch, tmp_path, [k + 1 for k in zlab])


def _doctor(out, engine: str):
    from eaglewire.doctor.commands import config_report
    from eaglewire.doctor.config import DoctorEngineConfig

    rep = config_report(DoctorEngineConfig(drafter_dir=out, engine=engine))
    return rep, {c.name: c for c in rep.checks}


def _dflash_exports_checked(arch, tmp_path, monkeypatch, zlab: list[int]) -> None:
    """z-lab (vllm) and speculators layouts, checked as vLLM reads them; the GGUF up to llama.cpp's converter (a
    stub here: it refuses every tiny tokenizer after 5-20 s), for the families llama.cpp captures from."""
    from eaglewire.export import gguf
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.infra.errors import EaglewireError

    for fmt in ("vllm", "speculators"):
        out = tmp_path / f"dflash-{fmt}"
        cfg = ExportConfig(ckpt=tmp_path / "dflash", format=fmt, out=out, verifier="org/target")
        if arch in VLLM_CANNOT:  # refused before writing, as the EAGLE-3 export is (export/dflash_io.py)
            with pytest.raises(EaglewireError, match=f"vllm 0.32.0 cannot capture .*{SERVED_AS[arch]}"):
                run_export(cfg)
            assert not out.exists()
            continue
        rec = run_export(cfg)
        assert rec["kind"] == "dflash" and rec["ids"] == (zlab if fmt == "vllm" else [k + 1 for k in zlab]), rec
        rep, rows = _doctor(out, "vllm" if fmt == "vllm" else "speculators")
        assert rep.exit_code() == 0 and rep.data["wiring"] == "OK", rep.to_dict()
    if arch not in LLAMA_CPP_CAN:
        return
    staged = {}
    monkeypatch.setattr(gguf, "write_drafter", lambda stage, dest, *_: (
        staged.update(json.loads((stage / "config.json").read_text())), dest.write_bytes(b"")))
    rec = run_export(ExportConfig(ckpt=tmp_path / "dflash", format="gguf", out=tmp_path / "dflash-gguf"))
    # the converter writes the staged z-lab ids + 1 (llama.cpp reads id k as the input of layer k)
    assert staged["dflash_config"]["target_layer_ids"] == zlab and rec["ids"] == [k + 1 for k in zlab], rec


def _peagle_exports_checked(arch, tmp_path, vllm_ids: list[int]) -> None:
    """The vllm layout (the speculators one is the same EAGLE-3 export, tests/doctor/test_peagle_config.py), checked
    as vLLM reads it; refused in one line where vLLM cannot capture."""
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.infra.errors import EaglewireError

    for fmt in ("vllm",):
        out = tmp_path / f"peagle-{fmt}"
        cfg = ExportConfig(ckpt=tmp_path / "peagle", format=fmt, out=out, verifier="org/target")
        if arch in VLLM_CANNOT:
            with pytest.raises(EaglewireError, match="does not support EAGLE3 interface"):
                run_export(cfg)
            assert not out.exists()
            continue
        assert run_export(cfg)["ids"] == vllm_ids
        rep, rows = _doctor(out, fmt)
        assert rep.exit_code() == 0 and rep.data["kind"] == "p-eagle", rep.to_dict()
        assert rows["parallel drafting"].ok and rows["mask token"].ok and rows["mask_hidden"].ok
