"""Which target classes SGLang 0.5.23 can feed a DFlash drafter from, re-derived from the pinned wheel's source.

Static AST over sglang/srt/models/ (as the EAGLE-3 set is derived in tests/export/test_vllm_model_files.py): a
registered class (a model file's EntryClass) is fed when it, or a base, defines `set_dflash_layers_to_capture`.
`set_dspark_layers_to_capture` alone does not count: configure_aux_hidden_state_capture takes it only when the
algorithm is DSPARK, and otherwise raises the line SGLANG_DFLASH_REFUSAL quotes.
"""

from __future__ import annotations

import re

import pytest

from eaglewire.targets.registry import pinned_version
from eaglewire.targets.support import (
    SGLANG_DFLASH_ARCHS,
    SGLANG_DFLASH_REFUSAL,
    SGLANG_EAGLE3_ARCHS,
    SGLANG_NO_EAGLE3_ARCHS,
    dflash_capture_refusal,
)
from eaglewire_testing.engine_code import Package, sources, wheel

pytestmark = pytest.mark.integration  # SGLang's own code, from its wheel

SETUP = "sglang/srt/model_executor/model_runner_components/attention_backend_setup.py"


@pytest.fixture(scope="module")
def whl():
    return wheel("sglang", pinned_version("sglang"))


def test_the_dflash_set_is_what_the_wheel_defines(whl):
    pk = Package.parse(sources(whl, "sglang/srt/models/"), "sglang.srt.models")
    found = [c for c in (pk.lookup(m, n) for m, n in pk.entries) if c is not None]
    yes = {c.name for c in found if pk.resolve(c, "set_dflash_layers_to_capture") is not None}
    assert yes == SGLANG_DFLASH_ARCHS, sorted(yes ^ SGLANG_DFLASH_ARCHS)
    # every registered class is judged: the EAGLE-3 tables list the same registry
    assert {c.name for c in found} == SGLANG_EAGLE3_ARCHS | SGLANG_NO_EAGLE3_ARCHS
    for arch in {c.name for c in found} - yes:
        assert dflash_capture_refusal("sglang", None, arch) is not None, arch
    for arch in yes:
        assert dflash_capture_refusal("sglang", None, arch) is None, arch


def test_the_refusal_quoted_is_the_engines_own_and_dspark_alone_is_not_enough(whl):
    src = "".join(sources(whl, SETUP).values())
    flat = re.sub(r'"\s+f?"', "", src)  # the message is split over adjacent string literals
    assert SGLANG_DFLASH_REFUSAL in flat
    assert 'if is_dspark and hasattr(model, "set_dspark_layers_to_capture")' in src
    assert 'elif hasattr(model, "set_dflash_layers_to_capture")' in src
