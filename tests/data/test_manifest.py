"""The dataset manifest as a typed record: round trip, files written before it, and malformed files."""

import json

import pytest

from eaglewire.data.manifest import MANIFEST, Manifest
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import Point

# A manifest as eaglewire 0.2 wrote it before the typed record (trimmed to two shards'
# worth of fields, values as written): every key must still read, and survive a rewrite.
OLD = {
    "format": "eaglewire-features", "format_version": 1, "complete": True,
    "target": {"spec": "tiny:llama", "path": "/cache/tiny-llama",
               "fingerprint": {"model_type": "llama", "num_layers": 8, "hidden_size": 64, "vocab_size": 1000,
                               "config_sha": "a", "tokenizer_sha": "b", "embedding_sha": "c"}},
    "points": {"names": ["layers.1.out", "layers.3.out", "layers.6.out"], "hf_index": [2, 4, 7],
               "sglang": [1, 3, 6], "vllm": [2, 4, 7]},
    "target_hidden": "final_norm", "chat_template_sha": "t", "generation": {"max_new_tokens": 24},
    "extract": {"points": ["layers.1.out", "layers.3.out", "layers.6.out"], "dtype": "fp32"},
    "shards": [{"file": "shard-00000.safetensors", "num_samples": 2, "num_tokens": 50, "num_loss_tokens": 20,
                "indices": [0, 1], "bytes": 10, "sha256": "x"}],
    "num_samples": 2, "num_tokens": 50, "num_loss_tokens": 20, "norm_stats": [], "dropped": {"truncated": 0},
    "vocab": {"size": 200}, "extract_tokens_per_s": 12.5, "a_future_key": {"kept": True},
}


def test_an_old_manifest_reads_typed_and_rewrites_without_losing_a_key(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps(OLD))
    man = Manifest.load(tmp_path)
    assert man.target.source == "tiny:llama" and man.num_layers == 8
    assert man.points == [Point.parse("layers.1.out"), Point.parse("layers.3.out"), Point.parse("layers.6.out")]
    assert man.sample_indices() == [0, 1] and man.vocab == {"size": 200} and man.complete
    man.save(tmp_path)
    new = json.loads((tmp_path / MANIFEST).read_text())
    assert new["a_future_key"] == {"kept": True}
    assert new["points"]["sglang"] == [1, 3, 6] and new["points"]["vllm"] == [2, 4, 7]
    assert new["target"]["source"] == "tiny:llama"
    assert {k: new[k] for k in OLD if k not in ("target", "points")} == {k: OLD[k] for k in OLD if k not in ("target", "points")}


def test_unknown_points_and_target_round_trip(tmp_path):
    raw = {**OLD, "target": {"source": None, "path": None, "fingerprint": {"num_layers": 8, "unknown": True}},
           "points": {"names": [None, None, None], "stated_by": "unknown"}}
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    man = Manifest.load(tmp_path)
    assert man.points is None and man.point_names == [None, None, None] and man.target.fingerprint.unknown
    man.save(tmp_path)
    again = Manifest.load(tmp_path)
    assert again.point_names == [None, None, None] and again.points_stated_by == "unknown"


@pytest.mark.parametrize("change,msg", [
    ({"format_version": 9}, "expected eaglewire-features v1"),
    ({"shards": "none"}, "'shards' missing or not a list"),
    ({"points": {"names": ["layers.9.out", "layers.1.out", "layers.2.out"]}}, "points"),
    ({"target": {"source": "x", "fingerprint": {"num_layers": "eight", "config_sha": "a"}}}, "num_layers"),
])
def test_malformed_manifests_name_the_file_and_field(tmp_path, change, msg):
    (tmp_path / MANIFEST).write_text(json.dumps({**OLD, **change}))
    with pytest.raises(EaglewireError, match=msg) as e:
        Manifest.load(tmp_path)
    assert str(tmp_path / MANIFEST) in str(e.value)


def test_a_missing_directory_says_so(tmp_path):
    with pytest.raises(EaglewireError, match="does not exist"):
        Manifest.load(tmp_path / "dta")
    with pytest.raises(EaglewireError, match="no manifest.json"):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("change, msg", [({"complete": "yes"}, "'complete' is 'yes': expected true or false"),
                                         ({"num_samples": -1}, "'num_samples' is -1"),
                                         ({"extract": [1]}, "'extract' is \\[1\\]: expected an object"),
                                         ({"vocab": 3}, "'vocab' is 3: expected an object or null")])
def test_mistyped_fields_are_named(tmp_path, change, msg):
    raw = {**OLD, **change}
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(EaglewireError, match=msg):
        Manifest.load(tmp_path)
