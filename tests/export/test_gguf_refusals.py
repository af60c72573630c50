"""What `export --format gguf` refuses, with the reason, before llama.cpp's converter is run."""

import pytest

from eaglewire.drafter import DrafterConfig
from eaglewire.export.gguf import check_type, llama_ids, refusals
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import FINAL_NORM, eagle3_default, layer_out


def _cfg(**kw):
    base = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1024, target_hidden_size=64,
                vocab_size=384, draft_vocab_size=200)
    return DrafterConfig(**{**base, **kw})


def test_a_default_drafter_gets_llamacpp_ids():
    assert refusals(_cfg(), eagle3_default(8), 8) == []
    assert llama_ids(_cfg(), eagle3_default(8), 8, "ckpt") == [2, 4, 5]


@pytest.mark.parametrize("kw, points, says", [
    ({}, [layer_out(1), layer_out(3), layer_out(7)], "layers.7.out"),
    ({}, [layer_out(1), layer_out(3), FINAL_NORM], "final_norm"),
    ({"num_aux": 4}, [layer_out(1), layer_out(2), layer_out(3), layer_out(4)], "exactly 3"),
    ({"fc_norm": True}, None, "fc_norm"),
    ({"num_layers": 2}, None, "one decoder layer"),
    ({"norm_before_fc": True}, None, "norm_before_fc"),
    ({"norm_output": True}, None, "norm_output"),
])
def test_what_llamacpp_cannot_serve_is_refused_with_the_reason(kw, points, says):
    why = refusals(_cfg(**kw), points or eagle3_default(8), 8)
    assert any(says in w for w in why), why
    with pytest.raises(EaglewireError, match="cannot export for llama.cpp"):
        llama_ids(_cfg(**kw), points or eagle3_default(8), 8, "ckpt")


def test_gguf_types_are_checked():
    assert check_type("--gguf-type", "Q8_0") == "q8_0"
    with pytest.raises(EaglewireError, match="--gguf-type 'q4_k'"):
        check_type("--gguf-type", "q4_k")
