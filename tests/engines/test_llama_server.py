"""The real llama.cpp (llama-server built from llama-cpp-python 0.3.36's tree) serves our GGUF drafter.

What is executed here, not read from source: llama.cpp's converter writes our
ids into `eagle3.target_layers`; llama-server reads id k as the input of layer
k (so a drafter exported for it accepts exactly what eaglewire predicts, per
position, on an F32 target); a far miswiring FAILs `doctor live`; ids off by one
FAIL `doctor config`, which names the ids to write. The target is a tiny random
llama with SmolLM2's tokenizer (llama.cpp's converter refuses unknown BPE
tokenizers); one server with the right drafter serves the whole module.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a real llama-server serving our drafter
EW = [sys.executable, "-m", "eaglewire.cli"]
DEPTH = 3
# llama.cpp's draft gate for the gated tests: the tiny drafter's median step confidence (its best draft among its 10
# best: 0.11-0.13 here, a near-uniform top 10), so about half the steps pass; real drafters are served at 0.5
P_MIN = 0.12


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, llama_server_bin):
    """(run dir, target dir, target F32 GGUF, exported drafter dir, SpecEngine) on the tiny SmolLM2-tokenizer llama."""
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.export.gguf import convert
    from eaglewire.targets.load import load_target
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train
    from eaglewire_testing.llamacpp import build_smollm_tiny
    from eaglewire_testing.tinydata import build_tiny_dataset

    root = tmp_path_factory.mktemp("llama")
    target = build_smollm_tiny(root / "target")
    ds = build_tiny_dataset(root, n=48, max_new_tokens=48, target=str(target))
    run_train(TrainConfig(data=ds, out=root / "run", device="cpu", max_steps=300, batch_size=4, lr=3e-3,
                          warmup_steps=5, ttt_steps=3, max_len=128, val_fraction=0.1, save_every=1000))
    target_gguf = convert(target, root / "target-f32.gguf", "f32")
    export = root / "gguf"
    run_export(ExportConfig(ckpt=root / "run" / "drafter", format="gguf", out=export, gguf_type="f32"))
    t = load_target(str(target))
    drafter, points, _ = load_drafter_for(t, root / "run" / "drafter")
    return root / "run", target, target_gguf, export, SpecEngine(t, drafter, points)


def _prompts(engine, n=6):
    from eaglewire.data.heldout import heldout_prompts_path
    from eaglewire.decoding.run import encode_prompt_file

    return encode_prompt_file(engine, heldout_prompts_path(), n)[0]


def _server(binary, target_gguf, drafter_gguf, log, p_min=0.0):
    from eaglewire.engines.llama_server import LlamaServer, LlamaSpec
    from eaglewire.engines.vllm_server import free_port

    spec = LlamaSpec(target_gguf=target_gguf, drafter_gguf=drafter_gguf, depth=DEPTH, port=free_port(), ctx=1024,
                     threads=2, p_min=p_min)
    return LlamaServer(binary, spec, log).start(timeout=120)


@pytest.fixture(scope="module")
def served(llama_run, llama_server_bin, tmp_path_factory):
    run, target, target_gguf, export, engine = llama_run
    log = tmp_path_factory.mktemp("llama-log") / "server.log"
    with _server(llama_server_bin, target_gguf, export / "drafter.gguf", log) as srv:
        yield srv


def test_export_writes_llamacpp_ids_into_the_gguf(llama_run):
    from eaglewire.doctor.gguf_config import read_gguf_meta

    run, target, _, export, engine = llama_run
    meta, _ = read_gguf_meta(export / "drafter.gguf")
    rec = json.loads((export / "eaglewire.export.json").read_text())
    # trained on the EAGLE-3 default for 8 layers: layers.1/3/4.out, which llama.cpp captures as inputs of 2, 4, 5
    assert rec["points"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    assert meta["eagle3.target_layers"] == rec["ids"] == [2, 4, 5]
    assert meta["general.architecture"] == "eagle3"


def test_served_acceptance_equals_ours_per_position(llama_run, served):
    from eaglewire.doctor.live import doctor_live

    run, target, _, export, engine = llama_run
    rep = doctor_live(served.spec.url, engine, _prompts(engine), 48)
    assert not rep.failed, rep.to_dict()
    s, p = rep.data["served"], rep.data["predicted"]
    assert rep.data["engine"].startswith("llama.cpp") and rep.data["depth"] == DEPTH
    assert s["drafts"] > 20 and sum(p["accepted_per_pos"]) > 10  # a real comparison, not 0 == 0
    assert abs(s["mean_acceptance_length"] - p["mean_acceptance_length"]) <= 0.02 * p["mean_acceptance_length"]
    outputs = next(c for c in rep.checks if c.name == "outputs")
    if not outputs.ok:  # F32 both sides: equal token for token, except where two logits tie to float rounding
        _assert_a_near_tie(target, _prompts(engine), outputs.detail)


def test_gated_server_accepts_what_the_step_gate_predicts(llama_run, llama_server_bin, tmp_path):
    """llama.cpp's --spec-draft-p-min, executed: a round stops drafting at the first step whose best draft
    (renormalized over its 10 best) is below p_min. eaglewire's chain gated by that rule predicts the served counts
    per position; a prediction that ignores the gate, or gates the cumulative probability, does not."""
    from eaglewire.decoding.engine import SpecConfig
    from eaglewire.doctor.live import Acceptance, doctor_live, predicted_acceptance

    run, target, target_gguf, export, engine = llama_run
    prompts = _prompts(engine)
    with _server(llama_server_bin, target_gguf, export / "drafter.gguf", tmp_path / "gated.log", P_MIN) as srv:
        rep = doctor_live(srv.spec.url, engine, prompts, 48, p_min=P_MIN)
        unsaid = doctor_live(srv.spec.url, engine, prompts[:3], 32)  # the gate not given: named, not blamed on wiring
    drafted = next(c for c in unsaid.checks if c.name == "draft tokens")
    assert not drafted.ok and "--p-min" in drafted.fix, unsaid.to_dict()
    assert not rep.failed, rep.to_dict()
    assert next(c for c in rep.checks if c.name == "draft tokens").ok
    s, p = rep.data["served"], rep.data["predicted"]
    assert rep.data["p_min"] == P_MIN and s["drafts"] > 20 and sum(p["accepted_per_pos"]) > 10
    assert abs(s["mean_acceptance_length"] - p["mean_acceptance_length"]) <= 0.02 * p["mean_acceptance_length"]
    ungated = predicted_acceptance(engine, prompts, DEPTH, 48)
    path = Acceptance(accepted_per_pos=[0] * DEPTH)
    for ids in prompts:  # our own cumulative gate at the same threshold: another rule, other rounds
        for st in engine.generate(ids, SpecConfig(mode="chain", depth=DEPTH, min_prob=P_MIN, max_new_tokens=48)
                                  ).metrics.steps:
            if st.drafted:
                path.add_round(st.accepted)
    for other in (ungated, path):  # the served gate is visible: both miss the served mean by far more than 2%
        m = other.mean_length or 1.0  # the path gate may draft nothing at this threshold: every round plain
        assert abs(s["mean_acceptance_length"] - m) > 0.05 * m, (s, other.to_dict())
    with _server(llama_server_bin, target_gguf, export / "drafter.gguf", tmp_path / "shut.log", 0.5) as srv:
        rep = doctor_live(srv.spec.url, engine, prompts[:2], 24, p_min=0.5)  # a gate this drafter never passes
    spec = next(c for c in rep.checks if c.name == "speculation")
    assert rep.failed and "drafted nothing at --spec-draft-p-min 0.5" in spec.detail and "--p-min" in spec.fix


def _assert_a_near_tie(target, prompts, detail: str) -> None:
    """llama.cpp keeps its KV cache in f16 (its default) and its kernels (built for this CPU) sum in other orders:
    where the target's two best logits are within f16 rounding (2^-11 relative), greedy outputs may part. Anything
    else is a real difference."""
    import re

    import torch

    from eaglewire.targets.load import load_target

    m = re.search(r"(\d+) of (\d+) greedy outputs .*prompt (\d+) differs from token (\d+)", detail)
    assert m and int(m[2]) - int(m[1]) <= 1, detail
    i, k = int(m[3]), int(m[4])
    model = load_target(str(target)).model
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompts[i]]), max_new_tokens=k, do_sample=False) if k else \
            torch.tensor([prompts[i]])
        logits = model(ids).logits[0, -1].double()  # [V]
    top = logits.topk(2).values
    assert float(top[0] - top[1]) <= 2e-3 * float(logits.abs().max()), (detail, top.tolist())


def test_serve_command_checks_llamacpp_and_says_ready(llama_run, llama_server_bin, tmp_path):
    """The README's `serve RUN --engine llama.cpp` then `doctor live --server ... --drafter RUN` as written, relative
    paths from the run's parent (tests/serve/test_vllm_serving.py walks the vLLM one): doctor live finds the export
    serve recorded and predicts at the gate serve recorded (before: a doubled path, then FAILs at p-min 0)."""
    from eaglewire.engines.vllm_server import free_port
    from eaglewire_testing.readme_walk import RUN, readme_command, stage_run, walk

    run, target, target_gguf, _, engine = llama_run
    stage_run(run, tmp_path)
    serve = readme_command(f"eaglewire serve {RUN} --engine llama.cpp")
    live = readme_command(f"eaglewire doctor live --server http://127.0.0.1:8000 --drafter {RUN}")
    w = walk(serve, live, tmp_path, free_port(), ["--target-gguf", str(target_gguf), "--gguf-type", "f32",
                                                  "--check-prompts", "3", "--threads", "2", "--llama-server",
                                                  str(llama_server_bin), "--p-min", str(P_MIN)])
    assert w["live"] is not None, w["serve_err"][-3000:]
    assert w["live"].returncode == 0, (w["live"].stdout[-3000:], w["live"].stderr[-2000:])
    assert f"--spec-draft-p-min {P_MIN:g} as " in w["live"].stdout  # the gate, read from serve.json
    record = json.loads((tmp_path / RUN / "serve" / "serve.json").read_text())
    assert record["export"] == "llama.cpp" and record["ids"] == [2, 4, 5] and record["p_min"] == P_MIN
    assert "--spec-type draft-eagle3" in record["command"] and f"--spec-draft-p-min {P_MIN:g}" in record["command"]
    assert w["serve_rc"] == 0 and "stopped: llama-server" in w["serve_err"] and "--resume" not in w["serve_err"]


def test_far_miswired_drafter_fails_live_and_config_names_the_ids(llama_run, llama_server_bin, tmp_path):
    """Negative control: every slot fed from the embedding and layer 0 instead of layers 1/3/4."""
    from eaglewire.doctor.live import doctor_live, static_check_for
    from eaglewire_testing.llamacpp import stage_gguf_with_ids

    run, target, target_gguf, export, engine = llama_run
    bad = stage_gguf_with_ids(tmp_path, run / "drafter", [0, 1, 1], tmp_path / "bad" / "drafter.gguf", target)
    static = static_check_for(bad.parent, ["layers.1.out", "layers.3.out", "layers.4.out"], 8, "LlamaForCausalLM")
    with _server(llama_server_bin, target_gguf, bad, tmp_path / "bad.log") as srv:
        rep = doctor_live(srv.spec.url, engine, _prompts(engine), 48, static)
    assert rep.failed
    bad_pos = [c for c in rep.checks if c.name.startswith("position") and not c.ok]
    assert bad_pos, rep.to_dict()
    points = next(c for c in rep.checks if c.name == "points")
    assert not points.ok and "[2, 4, 5]" in points.fix


def test_off_by_one_gguf_fails_doctor_config(llama_run, tmp_path):
    """The seeds' bug on llama.cpp: SGLang's ids (output of layer k) written where llama.cpp reads inputs."""
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire_testing.llamacpp import stage_gguf_with_ids

    run, target, _, export, engine = llama_run
    sg = run_export(ExportConfig(ckpt=run / "drafter", format="sglang", out=tmp_path / "sglang"))
    assert sg["ids"] == [1, 3, 4]
    naive = stage_gguf_with_ids(tmp_path, run / "drafter", sg["ids"], tmp_path / "naive" / "drafter.gguf", target)
    r = subprocess.run([*EW, "doctor", "config", str(naive), "--engine", "llama.cpp", "--trained-on", str(run / "drafter"),
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["fed"] == ["layers.0.out", "layers.2.out", "layers.3.out"]
    points = next(c for c in rep["checks"] if c["name"] == "points")
    assert not points["ok"] and "[2, 4, 5]" in points["fix"]
    ok = subprocess.run([*EW, "doctor", "config", str(export), "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the export itself: engine from its record, ids right


def test_quantized_drafter_and_target_serve(llama_run, llama_server_bin, tmp_path):
    """A Q8_0 drafter on a Q8_0 target (what users run) starts, drafts and answers. On a Xeon with AMX the native
    build of this llama.cpp crashed at warm-up on quantized weights until `llama_command` turned repacking off
    there; the served acceptance stays near our fp32 prediction (quantized both sides: not exact)."""
    from eaglewire.doctor.live import doctor_live
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.export.gguf import convert

    run, target, _, _, engine = llama_run
    q8 = tmp_path / "q8"
    run_export(ExportConfig(ckpt=run / "drafter", format="gguf", out=q8, gguf_type="q8_0"))
    target_q8 = convert(target, tmp_path / "target-q8_0.gguf", "q8_0")
    with _server(llama_server_bin, target_q8, q8 / "drafter.gguf", tmp_path / "q8.log") as srv:
        rep = doctor_live(srv.spec.url, engine, _prompts(engine, 3), 32)
    s, p = rep.data["served"], rep.data["predicted"]
    assert s["drafts"] > 10
    assert abs(s["mean_acceptance_length"] - p["mean_acceptance_length"]) <= 0.15 * p["mean_acceptance_length"]
