"""Deterministic tiny random targets (`tiny:<arch>`) for tests and quick runs.

Each has a real byte-level BPE tokenizer (trained locally on a built-in corpus,
so nothing touches the network) and the chat template family its architecture
ships with, so chat templating, loss masks and capture are exercised exactly
as on a real target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

import eaglewire.targets.families as families
import eaglewire.targets.tiny_families as tiny_families
from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.errors import EaglewireError

TINY_VERSION = 6  # bump when anything below changes the produced weights or tokenizer

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A speculative decoder drafts tokens
and the target verifies them in one forward pass. Hello, how are you today?
I am fine, thank you. Please write a short story about a robot who learns to paint.
Once upon a time there was a small village by the sea. The fishermen went out
every morning and came back every evening with their boats full of fish.
Explain why the sky is blue. Sunlight is scattered by the molecules of the air,
and blue light is scattered more than red light because of its shorter wavelength.
What is 12 plus 30? The answer is 42. Write a Python function that adds two numbers:
def add(a, b): return a + b. Lists, dictionaries and tuples are Python data types.
Summarize the following text in one sentence. Translate this sentence into French.
Give me three ideas for a birthday party. 1. A picnic in the park. 2. A movie night.
3. A treasure hunt. Thank you for your help! You are welcome. Can you help me plan
a trip to the mountains? Sure, here is a plan: pack warm clothes, water and snacks.
"""

# arch -> (special tokens, chat template, bos, eos)
_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
_DEEPSEEK = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% else %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
TEMPLATES = {
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
              _LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], _CHATML, None, "<|im_end|>"),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], _MISTRAL, "<s>", "</s>"),
    "deepseek_v3": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                    _DEEPSEEK, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}
TEMPLATES.update(tiny_families.TEMPLATES)
ARCHS = tuple(TEMPLATES)
_BPE_VOCAB = 384


def _tokenizer(arch: str):
    specials, template, bos, eos = TEMPLATES[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    if arch in tiny_families.KIMI_ARCHS:  # Kimi's tiktoken layout: specials after the ranks (tiny_families)
        return tiny_families.kimi_tokenizer(arch, tok, template, bos, eos)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos)
    fast.chat_template = template
    return fast


def _config(arch: str, vocab: int, bos_id, eos_id):
    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
        # head_dim 32: the smallest head vLLM's CPU attention runs (tests/targets/test_tiny.py says why)
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id, rms_norm_eps=1e-6,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        # Window layers from layer 4 on, window 16: mixed layer types, and tests decode past the window.
        return tf.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False, use_sliding_window=True,
                              sliding_window=16, max_window_layers=4)
    if arch == "mistral":
        return tf.MistralConfig(**common, sliding_window=16)  # every layer windowed; tests pass the window
    if arch == "deepseek_v3":
        common.update(num_attention_heads=4, num_key_value_heads=4)  # MLA: its own head sizes below
        return tf.DeepseekV3Config(
            **common, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
            kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        )
    return tiny_families.family_config(arch, vocab, bos_id, eos_id)


def _init_weights(model) -> None:
    """Random but non-degenerate: larger-than-default init so layers differ clearly."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))
            elif "norm" in name or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.zero_()


def build_tiny(arch: str, out_dir: Path, **overrides) -> Path:
    """Write a tiny random HF model directory for `arch` (atomic: temp dir then rename).

    `overrides` change config fields, e.g. ``use_sliding_window=False`` for a shape an engine runs.
    """
    if arch not in TEMPLATES:
        raise EaglewireError(f"tiny:{arch}: unknown architecture (expected one of {', '.join(ARCHS)})")
    tok = _tokenizer(arch)
    bos_id = tok.bos_token_id
    eos_id = tok.eos_token_id
    cfg = _config(arch, len(tok), bos_id, eos_id)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = families.model_class(cfg)._from_config(cfg, dtype=torch.float32)
    _init_weights(model)
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=[eos_id], pad_token_id=eos_id)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tiny_families.publish_layout(arch, tmp, out_dir)
        (tmp / "eaglewire_source.json").write_text(json.dumps({"kind": "tiny", "arch": arch, "version": TINY_VERSION}))
    return out_dir
