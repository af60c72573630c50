"""The drafter's attention geometry derived from the target's config (no weights: published configs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.drafter.config import DrafterConfig
from eaglewire.targets.families import native_config

pytestmark = pytest.mark.unit

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real_configs"


@pytest.mark.parametrize("name", ["kimi_k25", "kimi_k2", "deepseek_v32"])
def test_mla_target_gets_full_width_heads(name):
    """An MLA target's transformers head_dim is the rope part alone (64); the drafter's Llama layer takes
    v_head_dim-wide heads that tile the hidden size, as SpecForge's DeepSeek-V3 drafter (56 x 128)."""
    cfg = native_config(REAL / name)
    text = cfg.get_text_config()
    assert text.head_dim == text.qk_rope_head_dim  # the trap: transformers' MLA head_dim is the rope width
    d = DrafterConfig.from_target_config(cfg, draft_vocab_size=32000)
    assert (d.head_dim, d.num_attention_heads, d.num_key_value_heads) == (128, 56, 56)
    assert d.head_dim * d.num_attention_heads == d.hidden_size == 7168


def test_mla_geometry_can_match_a_published_drafter():
    """SpecForge's Kimi-K2.5 drafter chose 64 heads of 128: overrides still win over the derivation."""
    d = DrafterConfig.from_target_config(native_config(REAL / "kimi_k25"), draft_vocab_size=32000,
                                         num_attention_heads=64, num_key_value_heads=64)
    assert (d.head_dim, d.num_attention_heads) == (128, 64)


@pytest.mark.parametrize("name", ["qwen3_235b_a22b", "gpt_oss_120b", "glm4_6"])
def test_llama_like_targets_keep_their_geometry(name):
    text = native_config(REAL / name).get_text_config()
    d = DrafterConfig.from_target_config(text, draft_vocab_size=32000)
    assert d.num_attention_heads == text.num_attention_heads
    assert d.num_key_value_heads == text.num_key_value_heads
    assert d.head_dim == (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
