"""The seeds' bugs as regression tests: each caught, named and given the right fix; correct wiring passes."""

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest
import torch

from eaglewire.doctor.dataset import doctor_dataset
from eaglewire.doctor.drafter import doctor_drafter
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, read_provenance
from eaglewire.targets.fingerprint import chat_template_hash

L = 8  # tiny targets


def _check(rep, name):
    return next(c for c in rep.checks if c.name == name)


def _deploy(tmp_path, ckpt, mutate):
    d = tmp_path / "deploy"
    shutil.copytree(ckpt, d)
    (d / "eaglewire.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    mutate(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_correct_wiring_passes_clean(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    prov = read_provenance(ckpt)
    rep = doctor_dataset(data, tiny_targets["llama"])
    assert not rep.failed and all(c.ok for c in rep.checks)
    model, prov = load_checkpoint(ckpt)
    head = tiny_targets["llama"].model.get_output_embeddings().weight.float()
    rep = doctor_drafter(model, prov, data, head, num_samples=16)
    assert not rep.failed and rep.data["offline"]["tau_chain"] > 1.3
    sha = chat_template_hash(tiny_targets["llama"].tokenizer)
    rep = doctor_config(ckpt, "sglang", L, prov.point_names, prov.chat_template_sha, sha)
    assert not rep.failed


def test_a_drafter_served_with_embed_first_ids(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names  # layers.1/3/4.out
    d = _deploy(tmp_path, ckpt, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 2, 4]))  # vLLM: embed, l1, l3
    rep = doctor_config(d, "vllm", L, trained, None, None)
    c = _check(rep, "points")
    assert rep.failed and not c.ok and "embed" in c.detail
    assert c.fix == 'set "eagle_aux_hidden_state_layer_ids": [2, 4, 5] at the top level of config.json (ids for vllm 0.32.0)'


def test_b_dataset_labels_wrong(tiny_drafter, tiny_targets, tmp_path):
    _, data = tiny_drafter
    d = tmp_path / "ds"
    shutil.copytree(data, d)
    man = json.loads((d / "manifest.json").read_text())
    man["points"]["names"][0] = "embed"
    write_json_atomic(d / "manifest.json", man)
    rep = doctor_dataset(d, tiny_targets["llama"])
    c = _check(rep, "slot 0")
    assert rep.failed and not c.ok and "holds layers.1.out" in c.detail and "manifest says embed" in c.detail
    assert _check(rep, "slot 1").ok


def test_b2_unlabelled_foreign_dataset_is_identified(tiny_drafter, tiny_targets, tmp_path):
    _, data = tiny_drafter
    d = tmp_path / "ds"
    shutil.copytree(data, d)
    man = json.loads((d / "manifest.json").read_text())
    man["points"]["names"] = [None, None, None]
    write_json_atomic(d / "manifest.json", man)
    rep = doctor_dataset(d, tiny_targets["llama"])
    assert rep.data["identified"]["names"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    assert rep.data["identified"]["vllm"] == [2, 4, 5]


def test_c_d2t_read_as_absolute_ids(tiny_drafter, tiny_targets, tmp_path):
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    head = tiny_targets["llama"].model.get_output_embeddings().weight.float()
    with torch.no_grad():
        model.d2t.copy_(model.draft_target_ids())  # a tool that stored absolute ids
    rep = doctor_drafter(model, prov, data, head, num_samples=16)
    c = _check(rep, "d2t")
    assert not c.ok and "absolute" in c.detail and "offsets" in c.fix
    # and our loader refuses such a file outright when ids fall outside the vocab
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    sd = load_file(bad / "model.safetensors")
    sd["d2t"] = sd["d2t"] + torch.arange(sd["d2t"].numel()) + 200
    save_file(sd, str(bad / "model.safetensors"))
    with pytest.raises(EaglewireError, match="OFFSETS"):
        load_checkpoint(bad)


def test_d_sglang_vllm_one_layer_shift(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names
    sg = json.loads((ckpt / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    d = _deploy(tmp_path, ckpt, lambda c: c.update(eagle_aux_hidden_state_layer_ids=sg))  # copied verbatim to vLLM
    rep = doctor_config(d, "vllm", L, trained, None, None)
    c = _check(rep, "points")
    assert not c.ok and "layers.0.out" in c.detail and "[2, 4, 5]" in c.fix


def test_e_served_as_eagle1(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names
    d = _deploy(tmp_path, ckpt, lambda c: c.update(architectures=["LlamaForCausalLMEagle"]))
    rep = doctor_config(d, "sglang", L, trained, None, None)
    c = _check(rep, "eagle3 head")
    assert rep.failed and not c.ok and "EAGLE3" in c.fix


def test_f_chat_template_differs(tiny_drafter, tiny_targets):
    ckpt, _ = tiny_drafter
    prov = read_provenance(ckpt)
    other = chat_template_hash(tiny_targets["qwen3"].tokenizer)
    rep = doctor_config(ckpt, "sglang", L, prov.point_names, prov.chat_template_sha, other)
    assert rep.failed and not _check(rep, "chat template").ok


def test_cli_exit_codes_and_json(tiny_drafter, tmp_path):
    ckpt, data = tiny_drafter
    r = subprocess.run([sys.executable, "-m", "eaglewire.cli", "doctor", "dataset", str(data), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    d = _deploy(tmp_path, ckpt, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 4]))
    r = subprocess.run([sys.executable, "-m", "eaglewire.cli", "doctor", "config", str(d), "--engine", "vllm",
                        "--trained-on", str(ckpt)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "FAIL" in r.stdout and "[2, 4, 5]" in r.stdout


def test_offline_tau_uses_the_held_out_split_recorded_in_the_run(tiny_drafter, tiny_targets):
    ckpt, data = tiny_drafter
    model, prov = load_checkpoint(ckpt)
    val = prov.split["val_indices"]
    assert val and prov.split["num_samples"] > len(val)
    head = tiny_targets["llama"].model.get_output_embeddings().weight.float()
    rep = doctor_drafter(model, prov, data, head, num_samples=64)
    assert "held-out validation split" in rep.data["split"] and rep.data["offline"]["samples"] == len(val)
    assert _check(rep, "split").ok
    # without the record (an older run) the doctor says it evaluated on training samples
    old = dataclasses.replace(prov, split=None)
    rep = doctor_drafter(model, old, data, head, num_samples=64)
    assert rep.data["split"].startswith("TRAINING") and not _check(rep, "split").ok


@pytest.mark.parametrize("engine", ["sglang", "vllm", "speculators"])
def test_any_id_list_gets_a_verdict_per_id(tiny_drafter, tmp_path, engine):
    """The seeds' wrong fix (-1 for the embedding) and an id past the last layer: a verdict, never a usage error."""
    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names

    def mutate(c):
        if engine == "sglang":
            c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 2, 30]
        else:
            c["eagle_aux_hidden_state_layer_ids"] = [-1, 2, 30]
    d = _deploy(tmp_path, ckpt, mutate)
    rep = doctor_config(d, engine, L, trained, None, None)
    c = _check(rep, "ids capturable")
    assert rep.failed and not c.ok
    assert "-1 -> nothing" in c.detail and "30 -> nothing" in c.detail and "2 -> layers." in c.detail
    assert c.fix.startswith("set ") and _check(rep, "points").ok is False


def test_config_sizes_must_match_the_weights(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names
    d = _deploy(tmp_path, ckpt, lambda c: c.update(hidden_size=c["hidden_size"] * 2, intermediate_size=7))
    rep = doctor_config(d, "sglang", L, trained, None, None)
    c = _check(rep, "sizes")
    assert rep.failed and not c.ok and "intermediate_size" in c.detail and "fc.weight" in c.detail
    assert _check(doctor_config(ckpt, "sglang", L, trained, None, None), "sizes").ok


def test_dataset_doctor_checks_shards_and_fingerprint(tiny_drafter, tiny_targets, tmp_path):
    """Flipped bytes are reported as a corrupt shard (not as a wiring problem); an edited fingerprint fails."""
    _, data = tiny_drafter
    d = tmp_path / "ds"
    shutil.copytree(data, d)
    man = json.loads((d / "manifest.json").read_text())
    shard = d / man["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    rep = doctor_dataset(d, tiny_targets["llama"])
    c = _check(rep, "shards")
    assert rep.failed and not c.ok and "checksum" in c.detail and "--resume" in c.fix
    assert not any(x.name.startswith("slot") for x in rep.checks)
    shard.write_bytes(shard.read_bytes()[:100])  # truncated: still a verdict, no traceback
    assert "truncated" in _check(doctor_dataset(d, tiny_targets["llama"]), "shards").detail
    shutil.rmtree(d)
    shutil.copytree(data, d)
    man["target"]["fingerprint"]["num_layers"] = 9
    (d / "manifest.json").write_text(json.dumps(man))
    rep = doctor_dataset(d, tiny_targets["llama"])
    assert rep.failed and not _check(rep, "target").ok and "num_layers" in _check(rep, "target").detail


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "speculators"])
def test_rope_and_norm_fields_are_checked_against_training(tiny_drafter, tmp_path, fmt):
    """Fields no weight shape reveals: an export passes; an edited rope base, a dropped eps (the
    engine's default 1e-6 then applies) or flipped norm placement each fail with the value to set."""
    from eaglewire.doctor.records import trained_model_config
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export

    ckpt, _ = tiny_drafter
    trained = read_provenance(ckpt).point_names
    engine = {"sglang": "sglang", "vllm": "vllm", "speculators": "speculators"}[fmt]
    out = tmp_path / fmt
    run_export(ExportConfig(ckpt=ckpt, format=fmt, out=out))
    tcfg = trained_model_config(out)  # found through the export's record of its checkpoint
    assert tcfg == json.loads((ckpt / "config.json").read_text())["eaglewire_drafter_config"]
    assert _check(doctor_config(out, engine, L, trained, None, None, tcfg), "rope / norm").ok

    cfg = json.loads((out / "config.json").read_text())
    layer = cfg.get("transformer_layer_config") or cfg
    tcfg = {**tcfg, "rope_theta": 500000.0}  # as if trained with a long-context rope base...
    layer.pop("rope_theta", None)  # ...and served without the key: the engine's 10000 applies
    layer.pop("rope_parameters", None)
    layer["rms_norm_eps"] = tcfg["rms_norm_eps"] * 10
    # where the engine reads it: vLLM reads a speculators config's norm placement from the top level
    (cfg if fmt == "speculators" else layer)["norm_before_residual"] = not tcfg["norm_before_residual"]
    (out / "config.json").write_text(json.dumps(cfg))
    c = _check(doctor_config(out, engine, L, trained, None, None, tcfg), "rope / norm")
    assert not c.ok and "rope_theta is 10000.0 (absent: the engine default), trained with 500000.0" in c.detail
    assert '"rope_theta": 500000.0' in c.fix and f'"rms_norm_eps": {json.dumps(tcfg["rms_norm_eps"])}' in c.fix
    assert '"norm_before_residual"' in c.fix and "rope_scaling" not in c.fix
    assert _check(doctor_config(out, engine, L, trained, None, None, None), "rope / norm").level == "warning"


def test_seeds_kimi_ids_served_by_sglang_0_5_23(tmp_path):
    """The seeds' [2, 30, 58] on Kimi-K2.5 (61 layers), trained on classic SGLang's meaning: 0.5.23 reads
    them one layer early (its deepseek_v2.py adds +1 only when the first id is 1); the fix is [3, 31, 59]."""
    import json

    d = tmp_path / "kimi"
    d.mkdir()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"],
           "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    (d / "config.json").write_text(json.dumps(cfg))
    trained = ["layers.2.out", "layers.30.out", "layers.58.out"]
    kimi = "KimiK25ForConditionalGeneration"
    rep = doctor_config(d, "sglang==0.5.23", 61, trained, None, None, arch=kimi)
    c = _check(rep, "points")
    assert rep.failed and not c.ok and "['layers.1.out', 'layers.29.out', 'layers.57.out']" in c.detail
    assert c.fix.startswith('set "eagle_aux_hidden_state_layer_ids": [3, 31, 59] inside eagle_config')
    assert _check(doctor_config(d, "sglang==0.5.12", 61, trained, None, None, arch=kimi), "points").ok
    assert _check(doctor_config(d, "sglang==0.5.23", 61, trained, None, None, arch="LlamaForCausalLM"), "points").ok
    # no version named: the newest verified rule decides, and the report says where versions differ
    rep = doctor_config(d, "sglang", 61, trained, None, None, arch=kimi)
    assert rep.failed and "(= training)" in _check(rep, "engine versions").detail
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [3, 31, 59]
    (d / "config.json").write_text(json.dumps(cfg))
    assert not doctor_config(d, "sglang==0.5.23", 61, trained, None, None, arch=kimi).failed


def test_offline_rounds_are_replayed_like_a_greedy_server():
    """Rounds start at the first answer position and hop over what was accepted plus the bonus token."""
    import torch

    from eaglewire.decoding.acceptance import decode_rounds
    from eaglewire.doctor.live import Acceptance

    acc = Acceptance(accepted_per_pos=[0, 0])
    #        t: 0  1  2  3  4  5  6  7
    run = [9, 2, 0, 1, 2, 0, 1, 0]  # leading matches at each start (position 0 is prompt: not a start)
    starts = [False, True, True, True, True, True, True, True]
    for r in decode_rounds(torch.tensor([min(r, 2) for r in run]), torch.tensor(starts)):
        acc.add_round(r)
    # rounds at t=1 (2 accepted) -> t=4 (2) -> t=7 (0): 3 rounds, position 0 accepted twice, position 1 twice
    assert acc.drafts == 3 and acc.accepted_per_pos == [2, 2]
    assert acc.mean_length == 1 + 4 / 3


def test_doctor_drafter_on_a_target_it_does_not_fit_is_one_line(tiny_drafter, tmp_path):
    """A drafter made for another target (hidden 32, vocab 97 vs tiny:llama's 64, 384) is named, not a shape traceback."""
    from eaglewire_testing.cli import run_cli
    from eaglewire_testing.export_helpers import make_ckpt

    _, data = tiny_drafter
    ck, _ = make_ckpt(tmp_path / "other")
    r = run_cli("doctor", "drafter", ck, "--data", data, "--target", "tiny:llama", "--samples", "2")
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    assert "does not fit target" in r.stderr and "vocab 97" in r.stderr and "--target" in r.stderr, r.stderr
    missing = run_cli("doctor", "drafter", tmp_path / "typo", "--data", data)
    assert missing.returncode != 0 and "does not exist" in missing.stderr, missing.stderr
