"""The frozen parts training reads by name are the built target's own, on every tiny family, and nothing else
is made real: a quantized checkpoint's packed layers are never read.

The reference is `load_target` (transformers building the whole checkpoint, its weight-name conversion
included): the fingerprint, the head and the embedding must be exactly its.
"""

from __future__ import annotations

import pytest
import torch

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.load import load_target
from eaglewire.targets.shards import frozen_bytes, load_frozen
from eaglewire.targets.tiny import ARCHS
from eaglewire_testing.quantized import quantized_copy

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("arch", ARCHS)
def test_frozen_parts_and_fingerprint_are_the_built_targets(arch):
    full, frozen = load_target(f"tiny:{arch}"), load_frozen(f"tiny:{arch}")
    assert TargetFingerprint.of(frozen) == TargetFingerprint.of(full)
    for get in ("get_input_embeddings", "get_output_embeddings"):
        torch.testing.assert_close(getattr(frozen.model, get)().weight, getattr(full.model, get)().weight,
                                   rtol=0, atol=0)
    torch.testing.assert_close(decoder_stack(frozen.model).norm.weight, decoder_stack(full.model).norm.weight)
    assert all(p.is_meta for p in decoder_stack(frozen.model).layers.parameters())
    V, H = full.vocab_size, full.hidden_size
    tied = frozen.model.get_output_embeddings().weight.data_ptr() == frozen.model.get_input_embeddings().weight.data_ptr()
    norm = decoder_stack(full.model).norm.weight.numel()
    extra = frozen_bytes(frozen) - 4 * (V * H * (1 if tied else 2) + norm)
    assert 0 <= extra <= 64, extra  # small buffers only (Gemma's embedding scale): no layer was made real


def test_a_dense_layer_is_read_by_name_as_the_warm_start_needs_it():
    full, frozen = load_target("tiny:llama"), load_frozen("tiny:llama", (3,))
    a, b = decoder_stack(frozen.model).layers[3], decoder_stack(full.model).layers[3]
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=n)
    assert all(p.is_meta for p in decoder_stack(frozen.model).layers[2].parameters())


def test_a_quantized_checkpoint_gives_its_bf16_embedding_and_head_alone(tmp_path):
    d = quantized_copy("kimi_k25", tmp_path / "kimi-int4")
    frozen, full = load_frozen(str(d)), load_target("tiny:kimi_k25")
    for get in ("get_input_embeddings", "get_output_embeddings"):
        want = getattr(full.model, get)().weight.to(torch.bfloat16).float()
        torch.testing.assert_close(getattr(frozen.model, get)().weight, want, rtol=0, atol=0)
    assert all(p.is_meta for p in decoder_stack(frozen.model).layers.parameters())
    # the dataset's record (made from the unquantized target) compares equal: bf16 embedding, same geometry
    assert not TargetFingerprint.of(full).mismatch(TargetFingerprint.of(frozen))
    with pytest.raises(EaglewireError, match=r"layer 3's .* is not in .*quantized.*use --init head"):
        load_frozen(str(d), (3,))
