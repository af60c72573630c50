"""`export` of a DFlash drafter refuses, in one line and before writing, a format whose engine cannot feed it
from the target's class.

References are the engines' sources, written out here: SGLang 0.5.23's DFLASH calls the class's own
`set_dflash_layers_to_capture` and refuses a class without it (attention_backend_setup.py), which glm4_moe.py and
qwen2.py lack (they define only set_eagle3_layers_to_capture) and qwen3.py has; vLLM 0.32.0's DFlash proposer
needs SupportsEagle3, which Glm4MoeForCausalLM lacks and Qwen2ForCausalLM has; llama.cpp 0.3.36's glm4-moe graph
marks no layer inputs (no `res->t_layer_inp[il]` in src/models/glm4-moe.cpp).
"""

from __future__ import annotations

import pytest

from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire_testing.dflash_export import POINTS, L, dflash_config
from eaglewire_testing.export_helpers import provenance

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """One small DFlash checkpoint per target class (the class is all that differs)."""
    d = tmp_path_factory.mktemp("dflash-classes")
    out = {}
    for arch in ("Glm4MoeForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        fp = TargetFingerprint(num_layers=L, model_type="x", config_sha="test-drafter", arch=arch)
        out[arch] = save_dflash_checkpoint(d / arch, DFlashDrafter(dflash_config()),
                                           provenance(list(POINTS), L, fingerprint=fp))
    return out


@pytest.mark.parametrize("fmt, arch, engine, needle", [
    ("sglang", "Glm4MoeForCausalLM", "sglang 0.5.23", "set_dflash_layers_to_capture"),
    ("sglang", "Qwen2ForCausalLM", "sglang 0.5.23", "set_dflash_layers_to_capture"),
    ("vllm", "Glm4MoeForCausalLM", "vllm 0.32.0", "does not support EAGLE3 interface"),
    ("speculators", "Glm4MoeForCausalLM", "vllm 0.32.0", "does not support EAGLE3 interface"),
    ("gguf", "Glm4MoeForCausalLM", "llama.cpp 0.3.36", "layer input tensor is null"),
])
def test_a_format_whose_engine_cannot_feed_the_class_is_refused(ckpts, tmp_path, fmt, arch, engine, needle):
    """Before: written without a word (the EAGLE-3 export refused these; the DFlash export did not look)."""
    out = tmp_path / "out"
    with pytest.raises(EaglewireError) as e:
        run_export(ExportConfig(ckpt=ckpts[arch], format=fmt, out=out, verifier="org/target"))
    msg = str(e.value)
    assert "\n" not in msg and f"cannot export to {fmt}" in msg and arch in msg and engine in msg and needle in msg
    assert not out.exists()


@pytest.mark.parametrize("fmt, arch", [("sglang", "Qwen3ForCausalLM"), ("vllm", "Qwen2ForCausalLM"),
                                       ("speculators", "Qwen3ForCausalLM")])
def test_a_class_the_engine_feeds_is_exported(ckpts, tmp_path, fmt, arch):
    res = run_export(ExportConfig(ckpt=ckpts[arch], format=fmt, out=tmp_path / "out", verifier="org/target"))
    assert (tmp_path / "out" / "config.json").is_file() and res["format"] == fmt
