"""The target fingerprint: tells targets apart, ignores the load dtype, reads every encoding we ever wrote."""

import json

import pytest
import torch

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.targets.load import load_target


def test_fingerprint_distinguishes_targets(tiny_targets):
    a = TargetFingerprint.of(tiny_targets["llama"])
    b = TargetFingerprint.of(tiny_targets["mistral"])
    assert a == TargetFingerprint.of(tiny_targets["llama"])
    assert a.embedding_sha != b.embedding_sha
    assert "embedding_sha_bf16" in a.mismatch(b) and a.mismatch(a) == []


def test_fingerprint_does_not_depend_on_the_load_dtype():
    """A dataset extracted on CUDA (target in bf16) belongs to the same target as CPU training (fp32)."""
    fp32 = TargetFingerprint.of(load_target("tiny:llama"))
    bf16 = TargetFingerprint.of(load_target("tiny:llama", dtype=torch.bfloat16))
    assert fp32.embedding_sha != bf16.embedding_sha  # the raw bytes do differ...
    assert fp32.mismatch(bf16) == []  # ...the target does not
    other = TargetFingerprint.of(load_target("tiny:qwen3"))
    assert "embedding_sha_bf16" in fp32.mismatch(other)
    old = {k: v for k, v in fp32.to_json().items() if k != "embedding_sha_bf16"}  # a record from before the bf16 hash
    old_fp = TargetFingerprint.from_json(old)
    assert old_fp.mismatch(fp32) == []
    assert old_fp.mismatch(bf16) == ["embedding_sha"]


def test_round_trip_through_json_keeps_every_field(tiny_targets):
    fp = TargetFingerprint.of(tiny_targets["qwen3"])
    raw = json.loads(json.dumps(fp.to_json()))
    assert TargetFingerprint.from_json(raw) == fp
    assert set(raw) == {"num_layers", "model_type", "hidden_size", "vocab_size", "config_sha", "tokenizer_sha",
                        "embedding_sha", "embedding_sha_bf16", "arch"}
    assert raw["arch"] == "Qwen3ForCausalLM"  # the class engines dispatch on, beside the geometry


@pytest.mark.parametrize("raw", ["unknown", None, {"num_layers": 8, "unknown": True}, {"num_layers": 8, "test": True}])
def test_every_unknown_encoding_reads_as_unknown_and_never_mismatches(raw, tiny_targets):
    fp = TargetFingerprint.from_json(raw)
    assert fp.unknown
    assert fp.mismatch(TargetFingerprint.of(tiny_targets["llama"])) == []
    # one encoding on the way out, with what was known kept
    out = fp.to_json()
    assert out["unknown"] is True and ("num_layers" not in out or out["num_layers"] == 8)
    if isinstance(raw, dict) and "test" in raw:
        assert out["test"] is True  # fields this version does not know survive a rewrite


@pytest.mark.parametrize("raw,msg", [(42, "expected an object"), ({"num_layers": "8", "config_sha": "x"}, "num_layers"),
                                     ({"num_layers": 0, "config_sha": "x"}, "positive")])
def test_malformed_fingerprints_are_refused_naming_the_field(raw, msg):
    with pytest.raises(EaglewireError, match=msg):
        TargetFingerprint.from_json(raw, "manifest.json: target.fingerprint")


def test_target_record_reads_the_pre_0_2_spec_key():
    rec = TargetRecord.from_json({"spec": "tiny:llama", "fingerprint": {"num_layers": 8, "unknown": True}}, "x")
    assert rec.source == "tiny:llama" and rec.fingerprint.num_layers == 8
