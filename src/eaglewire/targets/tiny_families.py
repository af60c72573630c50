"""Tiny random targets of the families people serve (`tiny:kimi_k25`, `tiny:gpt_oss`, ...).

Each is built by transformers' own config class for its family, in the
layout its published checkpoints have: wrappers keep the language model one
level down under the published weight names and class names (Kimi-K2.5:
`KimiK25ForConditionalGeneration`, `language_model.model.layers.*`, an
`auto_map` to code that eaglewire must never import; Kimi-K2: `model_type:
kimi_k2` with an `auto_map`; both with Kimi's tokenizer files: `tiktoken.model`, code named by the
tokenizer's `auto_map` that writes a marker if anything imports it, no `tokenizer.json`), with the shape
of the family's chat template
(Kimi's `<|im_assistant|>assistant<|im_middle|>` with `<think>`, GPT-OSS's
harmony), so loading, capture, loss masks and layer ids are exercised as on
the real targets. Attention heads are 32 wide where the family allows, the
smallest vLLM's CPU attention runs. Kimi-K2.5 keeps its real 61 layers, so
the seeds' ids [2, 30, 58] name real layers.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import transformers as tf
from safetensors.torch import load_file, save_file
from transformers.convert_slow_tokenizer import bytes_to_unicode

from eaglewire.targets import tokenizers

_KIMI = (
    "{% for m in messages %}{% if m['role'] == 'system' %}<|im_system|>system<|im_middle|>"
    "{% elif m['role'] == 'user' %}<|im_user|>user<|im_middle|>"
    "{% else %}<|im_assistant|>assistant<|im_middle|><think></think>{% endif %}{{ m['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|><think></think>{% endif %}"
)
_HARMONY = (
    "<|start|>system<|message|>Reasoning: low<|end|>{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|return|>"
    "{% else %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>final<|message|>{% endif %}"
)
_GEMMA = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_LLAMA4 = (
    "{{ bos_token }}{% for m in messages %}<|header_start|>{{ m['role'] }}<|header_end|>\n\n"
    "{{ m['content'] }}<|eot|>{% endfor %}{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n"
    "{% endif %}"
)
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# arch -> (special tokens, chat template, bos, eos); Kimi's specials are not trained: they follow the ranks
# (_KIMI_ADDED, kimi_tokenizer)
TEMPLATES = {
    "kimi_k25": ([], _KIMI, "[BOS]", "<|im_end|>"),
    "kimi_k2": ([], _KIMI, "[BOS]", "<|im_end|>"),
    "gpt_oss": (["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>"],
                _HARMONY, None, "<|return|>"),
    "gemma3": (["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], _GEMMA, "<bos>", "<end_of_turn>"),
    "llama4": (["<|begin_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>"], _LLAMA4,
               "<|begin_of_text|>", "<|eot|>"),
    "qwen3_vl": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], _CHATML, None, "<|im_end|>"),
    **{a: (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], _CHATML, None, "<|im_end|>")
       for a in ("qwen3_moe", "qwen3_next", "qwen3_5", "glm4_moe", "minimax_m2")},
    "deepseek_v32": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                     "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
                     "{% else %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                     "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}",
                     "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

# The class each family is published and served as (what engines dispatch on, and `Target.arch` reads back).
SERVED_AS = {"kimi_k25": "KimiK25ForConditionalGeneration", "kimi_k2": "DeepseekV3ForCausalLM",
             "deepseek_v32": "DeepseekV32ForCausalLM", "gpt_oss": "GptOssForCausalLM",
             "qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
             "qwen3_5": "Qwen3_5ForConditionalGeneration", "glm4_moe": "Glm4MoeForCausalLM",
             "minimax_m2": "MiniMaxM2ForCausalLM", "llama4": "Llama4ForConditionalGeneration",
             "qwen3_vl": "Qwen3VLForConditionalGeneration", "gemma3": "Gemma3ForConditionalGeneration"}

_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6)
_MLA = dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=32,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, num_attention_heads=2, num_key_value_heads=2)
_VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)


def _ids(vocab: int, bos_id, eos_id) -> dict:
    return dict(vocab_size=vocab, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id)


def family_config(arch: str, vocab: int, bos_id, eos_id):
    """The family's config through transformers' own class (wrappers: the text part under text_config)."""
    ids = _ids(vocab, bos_id, eos_id)
    if arch in ("kimi_k25", "kimi_k2"):
        layers = 61 if arch == "kimi_k25" else 8  # Kimi-K2.5's real depth: the seeds' ids name real layers
        text = {**{k: v for k, v in _TEXT.items() if k != "head_dim"}, **_MLA, **ids, "model_type": "deepseek_v3",
                "num_hidden_layers": layers}
        if arch == "kimi_k2":
            return tf.DeepseekV3Config(**{k: v for k, v in text.items() if k != "model_type"},
                                       tie_word_embeddings=False)
        return tf.Kimi_K25Config(text_config=text, vision_config=_VISION, projection_hidden_size=32,
                                 tie_word_embeddings=False, **ids)
    if arch == "gpt_oss":  # eps as published: vLLM 0.32's gpt_oss.py builds its norms with eps=1e-5 (lines 449, 500)
        return tf.GptOssConfig(**{**_TEXT, "intermediate_size": 64, "rms_norm_eps": 1e-5}, **ids, num_local_experts=4,
                               num_experts_per_tok=2, sliding_window=16)
    if arch == "gemma3":
        return tf.Gemma3Config(text_config={**_TEXT, **ids, "sliding_window": 16},
                               vision_config={**_VISION, "image_size": 28, "patch_size": 14},
                               mm_tokens_per_image=4, **ids)
    if arch == "llama4":
        text = {**_TEXT, **ids, "intermediate_size_mlp": 128, "num_local_experts": 4, "interleave_moe_layer_step": 2}
        vision = {**_VISION, "image_size": 28, "patch_size": 14, "vision_output_dim": 32,
                  "projector_input_dim": 32, "projector_output_dim": 64}
        return tf.Llama4Config(text_config=text, vision_config=vision, **ids)
    if arch == "qwen3_vl":
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6], "mrope_interleaved": True}
        vision = dict(hidden_size=32, depth=1, num_heads=2, intermediate_size=32, out_hidden_size=64,
                      deepstack_visual_indexes=[0])
        return tf.Qwen3VLConfig(text_config={**_TEXT, **ids, "rope_parameters": rope}, vision_config=vision, **ids)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**_TEXT, **ids, **moe, decoder_sparse_step=1)
    if arch == "qwen3_next":  # hybrid: linear attention with a full-attention layer every 4th
        return tf.Qwen3NextConfig(**_TEXT, **ids, **moe, shared_expert_intermediate_size=32, full_attention_interval=4,
                                  linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                                  linear_value_head_dim=16)
    if arch == "qwen3_5":  # the published wrapper, hybrid text model one level down
        text = {**_TEXT, **ids, "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16}
        return tf.Qwen3_5Config(text_config=text, vision_config=dict(hidden_size=32, depth=1, num_heads=2,
                                                                     intermediate_size=32, out_hidden_size=64), **ids)
    if arch == "glm4_moe":
        return tf.Glm4MoeConfig(**_TEXT, **ids, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
    if arch == "minimax_m2":
        return tf.MiniMaxM2Config(**{**_TEXT, "intermediate_size": 32}, **ids, num_local_experts=4,
                                  num_experts_per_tok=2)
    if arch == "deepseek_v32":  # index_topk below a sample's length: the indexer really selects
        text = {**{k: v for k, v in _TEXT.items() if k != "head_dim"}, **_MLA, **ids}
        return tf.DeepseekV32Config(**text, index_topk=8, index_n_heads=2, index_head_dim=32)
    raise AssertionError(arch)


# Published layouts transformers does not write itself: {arch: (architectures, model_type, key renames)}.
_PUBLISHED = {
    "kimi_k25": (["KimiK25ForConditionalGeneration"], "kimi_k25", [("language_model.model.blocks.",
                                                                     "language_model.model.layers.")]),
    "kimi_k2": (["DeepseekV3ForCausalLM"], "kimi_k2", []),
}
_AUTO_MAP = {"kimi_k25": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                          "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
             "kimi_k2": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                         "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}

# Kimi's tokenizer as published: tiktoken.model and code named by tokenizer_config.json's auto_map (no
# tokenizer.json); its added_tokens_decoder by offset after the ranks (moonshotai/Kimi-K2-Instruct: 163584 +
# offset; Kimi-K2-Thinking adds <think> </think>, Kimi-K2.5 the media tokens, ids 163602-163607).
_KIMI_ADDED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
               6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
               11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
               14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
               22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}
_KIMI_MEDIA = {18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>"}
KIMI_TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
KIMI_ARCHS = ("kimi_k25", "kimi_k2")  # the tinies written with it
CODE_RAN = "CODE_RAN"  # what the tiny's tokenization_kimi.py writes if anything ever imports it
_KIMI_CODE = ('"""A stand-in for Kimi\'s tokenizer code: eaglewire reads tiktoken.model natively and must never '
              'import this."""\nimport pathlib\n\npathlib.Path({marker!r}).write_text("imported")\n'
              'raise ImportError("tokenization_kimi.py must never be imported")\n')


def kimi_added(arch: str, n_ranks: int) -> dict[int, str]:
    """{id: token} of the family's added_tokens_decoder for a rank file of `n_ranks` tokens."""
    return {n_ranks + k: v for k, v in {**_KIMI_ADDED, **(_KIMI_MEDIA if arch == "kimi_k25" else {})}.items()}


def _ranks_of(vocab: dict[str, int]) -> dict[bytes, int]:
    """A byte-level BPE's vocabulary as tiktoken ranks (its ids: the byte alphabet, then the merges in order)."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items()}


def kimi_tokenizer(arch: str, trained, template: str, bos: str, eos: str):
    """The tiny's trained BPE (no specials) as Kimi's tokenizer reads it: ranks, then the reserved specials."""
    ranks = _ranks_of(trained.get_vocab())
    added = kimi_added(arch, len(ranks))
    cfg = {"bos_token": bos, "eos_token": eos, "pad_token": "[PAD]", "unk_token": "[UNK]",
           "added_tokens_decoder": {str(i): t for i, t in added.items()}}
    return tokenizers.build(ranks, tokenizers.KIMI, tokenizers.special_tokens(cfg, len(ranks), tokenizers.KIMI, "tiny"),
                            cfg, template)


def _kimi_tokenizer_files(arch: str, d: Path, final: Path) -> None:
    """Rewrite a saved tiny tokenizer into Kimi's published files: tiktoken.model, tokenizer_config.json with
    the auto_map, the code (a marker), no tokenizer.json."""
    saved = json.loads((d / "tokenizer.json").read_text())
    n = min(int(t["id"]) for t in saved["added_tokens"])
    ranks = _ranks_of({k: v for k, v in saved["model"]["vocab"].items() if v < n})
    (d / "tiktoken.model").write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r
                                                for t, r in sorted(ranks.items(), key=lambda x: x[1])))
    old = json.loads((d / "tokenizer_config.json").read_text())
    spec = {"content": None, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}
    cfg = {"added_tokens_decoder": {str(i): {**spec, "content": t} for i, t in kimi_added(arch, n).items()},
           "auto_map": KIMI_TOKENIZER_AUTO_MAP, "bos_token": old["bos_token"], "eos_token": old["eos_token"],
           "pad_token": "[PAD]", "unk_token": "[UNK]", "clean_up_tokenization_spaces": False,
           "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "TikTokenTokenizer"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (d / "tokenization_kimi.py").write_text(_KIMI_CODE.format(marker=str(Path(final) / CODE_RAN)))
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (d / name).unlink(missing_ok=True)


def _published_fields(arch: str, raw: dict) -> dict:
    """Fields a family's published config.json has that transformers does not write, and engines read."""
    if arch == "minimax_m2":  # vLLM 0.32's MiniMaxM2 reads config.rotary_dim (models/minimax_m2.py:274), and
        # config.scoring_func / use_routing_bias (:85, :99; without the bias it routes on the bare sigmoid, not on
        # transformers' sigmoid + e_score_correction_bias): MiniMax-M2's published values
        rope = raw.get("rope_parameters") or {}
        return {"rotary_dim": int(raw["head_dim"] * rope.get("partial_rotary_factor", 1.0)),
                "scoring_func": "sigmoid", "use_routing_bias": True}
    return {}


def publish_layout(arch: str, d: Path, final: Path | None = None) -> None:
    """Rewrite a saved tiny model into its family's published layout: class names, model_type, auto_map
    (to files that are not there: eaglewire must never look them up), fields engines read, the shards' weight
    names, the tokenizer's files. `final`: where `d` will live (the tokenizer code's marker names it)."""
    if arch in KIMI_ARCHS:
        _kimi_tokenizer_files(arch, Path(d), Path(final or d))
    cfg_path = Path(d) / "config.json"
    raw = json.loads(cfg_path.read_text())
    if fields := _published_fields(arch, raw):
        cfg_path.write_text(json.dumps({**raw, **fields}, indent=2))
    if arch not in _PUBLISHED:
        return
    archs, model_type, renames = _PUBLISHED[arch]
    raw.update(architectures=archs, model_type=model_type, auto_map=_AUTO_MAP[arch])
    if isinstance(raw.get("text_config"), dict):
        raw["text_config"]["model_type"] = "kimi_k2"  # as published: transformers reads it as deepseek_v3
    cfg_path.write_text(json.dumps(raw, indent=2))
    for fp in sorted(Path(d).glob("*.safetensors")):
        tensors = load_file(str(fp))
        renamed = {}
        for k, v in tensors.items():
            for old, new in renames:
                k = k.replace(old, new)
            renamed[k] = v
        save_file(renamed, str(fp), metadata={"format": "pt"})
