"""(producer, version) -> the engine rule its training read a drafter's ids with (eaglewire.targets.producers).

Expected points are the engines' executed rules (tests/export/test_engine_conformance.py) and SpecForge's
(tests/targets/test_producer_conformance.py), written out here as plain layer numbers.
"""

from __future__ import annotations

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.producers import Producer, readings, trained_points

pytestmark = pytest.mark.unit

NESTED = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}


def _layers(cfg, spec, arch="kimi_k25", L=61):
    return [p.layer for p in trained_points(cfg, Producer.parse(spec), L, arch)[0]]


@pytest.mark.parametrize("spec, kimi, llama", [
    ("specforge==0.2.0", [1, 29, 57], [2, 30, 58]),  # SGLang 0.5.14: no +1 on Kimi unless the first id is 1
    ("specforge==0.1.0", [1, 29, 57], [1, 29, 57]),  # fixed HF [2, L//2, L-3] = outputs of layers 1, 29, 57
    ("sglang==0.5.12", [2, 30, 58], [2, 30, 58]),
    ("sglang==0.5.13", [1, 29, 57], [2, 30, 58]),
    ("vllm==0.32.0", [1, 29, 57], [1, 29, 57]),
    ("speculators==0.9.0", [1, 29, 57], [1, 29, 57]),
])
def test_the_seeds_ids_per_producer(spec, kimi, llama):
    assert _layers(NESTED, spec) == kimi
    assert _layers(NESTED, spec, "LlamaForCausalLM") == llama


def test_the_key_each_producer_writes_wins():
    both = {"eagle_aux_hidden_state_layer_ids": [3, 31, 59], **NESTED}
    assert _layers(both, "speculators==0.9.0") == [2, 30, 58]  # top level, vLLM meaning
    assert _layers(both, "sglang==0.5.12") == [2, 30, 58]  # nested, classic meaning
    assert _layers({"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}, "sglang==0.5.12") == [2, 30, 58]


def test_specforge_default_is_the_eagle3_triple_on_kimi():
    assert _layers({}, "specforge==0.2.0") == [1, 29, 57]  # its [1, 29, 57] with a first id of 1: +1 on


def test_uncapturable_ids_raise_and_readings_say_so():
    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 30, 58]}}
    with pytest.raises(EaglewireError, match="cannot capture"):
        _layers(cfg, "sglang==0.5.23")  # raw id 0 on Kimi: the embedding, which SGLang cannot capture
    groups = dict((tuple(p.label() for p in ps), names) for names, ps in readings(cfg, 61, "kimi_k25"))
    assert groups[("specforge 0.2.0 (SGLang 0.5.14)", "SGLang >= 0.5.13 capture")] is None


@pytest.mark.parametrize("spec, msg", [("specforge==9", "known: 0.1.0, 0.2.0"), ("eagle", "expected one of"),
                                       ("sglang==abc", "release number"), ("eaglewire==1.0", "--trained-on")])
def test_bad_producers(spec, msg):
    with pytest.raises(EaglewireError, match=msg):
        Producer.parse(spec)


def test_versions_offered_when_none_is_named():
    assert [p.version for p in Producer.parse("specforge").versions()] == ["0.1.0", "0.2.0"]
    assert len(Producer.parse("sglang").versions()) == 2 and Producer.parse("vllm").versions() == [Producer("vllm")]
