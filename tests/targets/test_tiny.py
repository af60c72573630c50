"""Facts every tiny target keeps, whatever its family."""

from __future__ import annotations

import pytest

from eaglewire.targets import families, tiny

pytestmark = pytest.mark.unit

# Multi-head latent attention: vLLM's CPU MLA runs only kv_lora_rank + qk_rope_head_dim in {320, 512, 576}
# (vllm/model_executor/layers/attention/mla_attention.py), ten times the tiny's weights; its capture test
# overrides the sizes instead.
MLA = {"deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25"}


@pytest.mark.parametrize("arch", [a for a in tiny.ARCHS if a not in MLA])
def test_every_tiny_attention_head_is_at_least_32_wide(arch):
    """vLLM's CPU attention runs no head narrower than 32: `data build --engine vllm --target tiny:llama` with the
    old 16-wide heads died inside vLLM ('Unsupported CPU attention configuration: head_dim=16') on an
    AVX-512/AMX machine. Every tiny target must be servable as built, with no override."""
    text = families.text_config(tiny._config(arch, 384, 0, 1))
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert head >= 32, (arch, head)


@pytest.mark.parametrize("arch", sorted(MLA))
def test_the_families_left_out_are_latent_attention(arch):
    assert families.text_config(tiny._config(arch, 384, 0, 1)).kv_lora_rank > 0
