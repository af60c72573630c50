"""The `layers` warning about SGLang versions: one clause per meaning, each version named once, and none when
--arch and a version already decide what the ids mean."""

import pytest

from eaglewire.targets.config import LayersConfig
from eaglewire.targets.layers import convert_layers
from eaglewire.targets.points import SGLANG_FIRST_ID_RULE_SINCE, version_differences

pytestmark = pytest.mark.unit


def test_each_meaning_is_one_clause_naming_each_version_once():
    """Before: 'sglang < 0.5.13 on most targets, sglang < 0.5.13 on DeepSeek-family targets, sglang 0.5.23 on most
    targets capture [...]'."""
    w = version_differences([2, 15, 29], "sglang", 32)
    old = f"SGLang < {SGLANG_FIRST_ID_RULE_SINCE}"
    assert w.count(old) == 1 and f"{old} (any target)" in w
    clauses = w.split(": ", 1)[1].split("; ")
    assert clauses[0].startswith("layers.2.out, layers.15.out, layers.29.out to ")
    assert clauses[1].startswith("layers.1.out, layers.14.out, layers.28.out to ") and "DeepSeek-family" in clauses[1]


def test_no_warning_when_version_and_arch_decide():
    """Before: the classic SGLang ids of the table were checked without --arch, so a Llama warned about DeepSeek."""
    res = convert_layers(LayersConfig(ids=[2, 15, 29], target_layers=32, layers_from="sglang==0.5.23",
                                      arch="LlamaForCausalLM"))
    assert [w for w in res["warnings"] if "read differently" in w] == []
    res = convert_layers(LayersConfig(ids=[2, 15, 29], target_layers=32, layers_from="sglang==0.5.23"))
    assert any("read differently" in w for w in res["warnings"])  # without --arch the difference is real
