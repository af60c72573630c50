"""The seeds' bugs on the real default target (30 layers): caught, named, fixed; correct wiring clean."""

import json

import pytest

from eaglewire.data.extract import ExtractSettings, extract
from eaglewire.doctor.dataset import doctor_dataset
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.infra.atomic import write_json_atomic
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire_testing.export_helpers import provenance

pytestmark = pytest.mark.slow
TRAINED = ["layers.2.out", "layers.15.out", "layers.27.out"]  # the example triple


@pytest.fixture(scope="module")
def default_ds(default_target, tmp_path_factory):
    rows = [{"index": i, "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for i, (q, a) in enumerate([("Name a color.", "Blue is a color."), ("Say hi.", "Hi! How can I help you today?")])]
    d = tmp_path_factory.mktemp("defds")
    extract(default_target, rows, d, ExtractSettings(points=TRAINED, dtype="bf16"), gen={})
    return d


@pytest.fixture(scope="module")
def default_ckpt(default_target, tmp_path_factory):
    cfg = DrafterConfig.from_target_config(default_target.config, draft_vocab_size=1024)
    out = tmp_path_factory.mktemp("defck") / "drafter"
    save_checkpoint(out, Eagle3Drafter(cfg), provenance(TRAINED, 30, chat_template_sha="x"))
    return out


def test_dataset_slots_identified(default_target, default_ds):
    rep = doctor_dataset(default_ds, default_target)  # its time budget is a benchmark figure, not an assert
    assert not rep.failed
    assert rep.data["identified"]["names"] == TRAINED and rep.data["identified"]["sglang"] == [2, 15, 27]


def test_dataset_label_says_embed(default_target, default_ds, tmp_path):
    import shutil

    d = tmp_path / "ds"
    shutil.copytree(default_ds, d)
    man = json.loads((d / "manifest.json").read_text())
    man["points"]["names"][0] = "embed"
    write_json_atomic(d / "manifest.json", man)
    rep = doctor_dataset(d, default_target)
    c = next(c for c in rep.checks if c.name == "slot 0")
    assert not c.ok and "holds layers.2.out" in c.detail and "embed" in c.detail


def _deploy(tmp_path, ckpt, **update):
    import shutil

    d = tmp_path / "deploy"
    shutil.copytree(ckpt, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(update)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_config_bugs_on_default(default_ckpt, tmp_path):
    ok = doctor_config(default_ckpt, "sglang", 30, TRAINED, None, None)
    assert not ok.failed  # nested [2, 15, 27]: correct for SGLang
    # (a) served as [embed, layers.2.out, layers.15.out]: vLLM ids [0, 3, 16]
    rep = doctor_config(_deploy(tmp_path / "a", default_ckpt, eagle_aux_hidden_state_layer_ids=[0, 3, 16]), "vllm", 30, TRAINED, None, None)
    c = next(c for c in rep.checks if c.name == "points")
    assert not c.ok and "embed" in c.detail and c.fix.startswith('set "eagle_aux_hidden_state_layer_ids": [3, 16, 28]')
    # (d) SGLang ids copied verbatim to vLLM: one layer early
    rep = doctor_config(_deploy(tmp_path / "d", default_ckpt, eagle_aux_hidden_state_layer_ids=[2, 15, 27]), "vllm", 30, TRAINED, None, None)
    c = next(c for c in rep.checks if c.name == "points")
    assert not c.ok and "layers.1.out" in c.detail and "[3, 16, 28]" in c.fix
    # (e) served as EAGLE-1
    rep = doctor_config(_deploy(tmp_path / "e", default_ckpt, architectures=["LlamaForCausalLMEagle"]), "sglang", 30, TRAINED, None, None)
    assert not next(c for c in rep.checks if c.name == "eagle3 head").ok
    # (f) chat template differs
    rep = doctor_config(default_ckpt, "sglang", 30, TRAINED, "aaaa", "bbbb")
    assert not next(c for c in rep.checks if c.name == "chat template").ok
