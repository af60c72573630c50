"""Issue 52: the quick pipeline on the target eaglewire was made for, `eaglewire demo --target tiny:kimi_k25`, every
stage, as a user runs it.

The expected answers are written out here from the sources, not computed by the code under test:
- the quick preset captures `eagle3-deep`, HF hidden-state indices [2, L//2, L-1]; Kimi-K2.5 keeps its real 61
  layers, so HF [2, 30, 60] are the outputs of layers 1, 29 and 59;
- what each export's ids mean is read back through `eaglewire.targets.points` with the engine's own rule and the
  served class (the reader, not the writer): SGLang 0.5.23 on KimiK25ForConditionalGeneration adds its +1 when
  the first id is 1 (deepseek_v2.py), vLLM reads id i as the input of layer i;
- llama.cpp 0.3.36 serves Kimi-K2.5 through its deepseek2 graph, which marks no layer inputs (`t_layer_inp`),
  so no GGUF drafter can be fed (tests/test_families_pipeline.py cites the source);
- Kimi-K2.5's layers are MLA attention over a mixture of experts: the warm start (`--init target`) has no
  Llama layer to copy, so the drafter starts from the head, and the report says so.
"""

from __future__ import annotations

import json
import re

import pytest

from eaglewire.targets.points import fed_points
from eaglewire_testing.cli import run_cli
from eaglewire_testing.dflash import one_thread

pytestmark = pytest.mark.e2e  # the whole demo, every stage, on the 61-layer tiny Kimi-K2.5

SERVED = "KimiK25ForConditionalGeneration"
POINTS = ["layers.1.out", "layers.29.out", "layers.59.out"]
# format -> (engine whose rule reads the ids, where its config keeps them, the ids that rule needs for POINTS)
EXPORTS = {"sglang": ("sglang==0.5.23", ("eagle_config", "eagle_aux_hidden_state_layer_ids"), [1, 29, 59]),
           "vllm": ("vllm==0.32.0", ("eagle_aux_hidden_state_layer_ids",), [2, 30, 60])}
STAGES = {"data", "train", "doctor", "heldout", "bench", "llamacpp"}


@pytest.fixture(scope="module")
def _one_thread():
    yield from one_thread()  # 61 tiny layers: OpenMP threads that lost their core cost 6x per forward here


@pytest.fixture(scope="module")
def demo(tmp_path_factory, _one_thread):
    run = tmp_path_factory.mktemp("kimi") / "demo"
    r = run_cli("demo", "--target", "tiny:kimi_k25", "--run-dir", run, "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return run, (run / "report.md").read_text()


def _row(md: str, label: str) -> str:
    return next(x for x in md.splitlines() if x.startswith(f"| {label} |"))


def test_every_stage_ran_on_kimis_61_layers_at_its_points(demo):
    run, md = demo
    assert {p.stem for p in (run / "stages").glob("*.json")} == STAGES
    prov = json.loads((run / "train" / "drafter" / "eaglewire.json").read_text())
    assert prov["points"]["names"] == POINTS
    assert prov["target"]["fingerprint"]["num_layers"] == 61 and prov["target"]["fingerprint"]["arch"] == SERVED
    for data in ("data", "heldout"):
        assert json.loads((run / data / "manifest.json").read_text())["points"]["names"] == POINTS
    assert _row(md, "Capture points (physical)") == f"| Capture points (physical) | {', '.join(POINTS)} |"
    # the fitted preset, each change with its reason, before any figure
    assert "--init head instead of the preset's --init target: the target's layer 60 has a DeepseekV3Attention" in md
    assert "tiny:kimi_k25 is a tiny random model" in md


@pytest.mark.parametrize("fmt", sorted(EXPORTS))
def test_every_export_feeds_the_trained_points_under_its_engines_rule(demo, fmt):
    run, md = demo
    engine, key, want = EXPORTS[fmt]
    cfg = json.loads((run / "export" / fmt / "config.json").read_text())
    for k in key:
        cfg = cfg[k]
    assert cfg == want
    assert [p.name for p in fed_points(cfg, engine, 61, SERVED)] == POINTS
    assert f"made by the demo: {run}/export/{fmt}, ids {want}" in _row(md, f"Export for {fmt}")
    check = next(r for r in json.loads((run / "stages" / "doctor.json").read_text())["reports"]
                 if r.get("engine") == fmt)
    assert check["command"] == "config" and check["ok"], check


def test_held_out_acceptance_is_a_number_with_its_interval(demo):
    run, md = demo
    off = json.loads((run / "stages" / "heldout.json").read_text())["report"]["offline"]
    lo, hi = off["mean_acceptance_length_ci95"]
    assert 1.0 <= lo <= off["mean_acceptance_length"] <= hi <= 1.0 + off["depth"]
    assert off["samples"] >= 40  # the shipped held-out prompts (54; an answer that ends at once has no round)
    cell = _row(md, "held-out mean acceptance length (`doctor drafter --data heldout`)").split(" | ")[1]
    assert re.fullmatch(r"\d\.\d\d \(95% \d\.\d\d-\d\.\d\d\)", cell), cell


def test_llama_cpp_is_refused_naming_the_engine_and_why(demo):
    run, md = demo
    row = _row(md, "Export for gguf (llama.cpp)")
    assert "refused, nothing written: llama.cpp 0.3.36 cannot capture EAGLE-3 features from " + SERVED in row
    assert "deepseek2 graph marks no layer inputs" in row
    assert not (run / "export" / "llama.cpp").exists()
