"""Drafter provenance as a typed record: v1 files (trained and imported) read, v2 stores the fingerprint once."""

import json

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.provenance import FILE, Provenance
from eaglewire.targets.points import Point

FP = {"model_type": "llama", "num_layers": 8, "hidden_size": 64, "vocab_size": 1000, "config_sha": "a",
      "tokenizer_sha": "b", "embedding_sha": "c", "embedding_sha_bf16": "d"}
NAMES = ["layers.1.out", "layers.3.out", "layers.6.out"]
V1_TRAINED = {"format": "eaglewire-drafter", "version": 1,
              "points": {"names": NAMES, "sglang": [1, 3, 6]}, "target_num_layers": 8,
              "target": {"source": "tiny:llama", "fingerprint": FP}, "target_fingerprint": FP,
              "dataset": {"path": "runs/data", "manifest_sha": "m"}, "chat_template_sha": "t",
              "vocab": {"size": 200}, "training": {"total_steps": 3}, "validation": {"acc_0": 0.5},
              "split": {"dataset_manifest_sha": "m", "val_indices": [1]}}
V1_IMPORTED = {"format": "eaglewire-drafter", "version": 1,
               "points": {"names": NAMES}, "target_num_layers": 8, "target": None,
               "target_fingerprint": "unknown", "dataset": "unknown", "chat_template_sha": "unknown",
               "imported": {"format": "vllm"}}


def _write(tmp_path, raw):
    (tmp_path / FILE).write_text(json.dumps(raw))
    return tmp_path


def test_v1_trained_reads_and_v2_stores_the_fingerprint_once(tmp_path):
    prov = Provenance.load(_write(tmp_path, V1_TRAINED))
    assert prov.points == [Point.parse(n) for n in NAMES] and prov.num_layers == 8
    assert prov.fingerprint.config_sha == "a" and prov.manifest_sha == "m" and prov.target.source == "tiny:llama"
    prov.save(tmp_path)
    raw = json.loads((tmp_path / FILE).read_text())
    assert raw["version"] == 2 and "target_fingerprint" not in raw and raw["target"]["fingerprint"] == FP
    assert raw["points"]["names"] == NAMES and raw["points"]["sglang"] == [1, 3, 6] and raw["target_num_layers"] == 8
    assert Provenance.load(tmp_path) == prov


def test_v1_imported_reads_unknowns_as_unknown(tmp_path):
    prov = Provenance.load(_write(tmp_path, V1_IMPORTED))
    assert prov.fingerprint.unknown and prov.num_layers == 8 and prov.target.source is None
    assert prov.dataset is None and prov.chat_template_sha is None and prov.imported == {"format": "vllm"}
    assert prov.point_names == NAMES


@pytest.mark.parametrize("raw,msg", [
    ({**V1_TRAINED, "version": 7}, "v1 or v2"),
    ({**V1_TRAINED, "points": {"names": ["layers.12.out"] * 3}}, "points"),
    ({**V1_IMPORTED, "target_num_layers": None}, "layer count is not recorded"),
])
def test_malformed_provenance_names_the_file(tmp_path, raw, msg):
    with pytest.raises(EaglewireError, match=msg) as e:
        Provenance.load(_write(tmp_path, raw))
    assert str(tmp_path / FILE) in str(e.value)


V2_TRAINED = {**{k: v for k, v in V1_TRAINED.items() if k != "target_fingerprint"}, "version": 2}


@pytest.mark.parametrize("change, field", [
    ({"target": None}, "field target"),  # was read as an imported drafter's (no target, nothing to check)
    ({"target": {"source": "tiny:llama"}}, "field target.fingerprint"),
    ({"points": None}, "field points"),
    ({"points": {"names": "layers.1.out"}}, "field points"),
    ({"dataset": [1, 2]}, "field dataset"),
    ({"imported": "yes"}, "field imported"),
    ({"chat_template_sha": 12345}, "field chat_template_sha"),
])
def test_a_damaged_v2_record_is_refused_not_read_as_imported(tmp_path, change, field):
    assert Provenance.load(_write(tmp_path, V2_TRAINED)).points == [Point.parse(n) for n in NAMES]
    with pytest.raises(EaglewireError, match=rf"^{tmp_path / FILE}: {field}") as e:
        Provenance.load(_write(tmp_path, {**V2_TRAINED, **change}))
    assert "\n" not in str(e.value)
