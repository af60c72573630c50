"""The target's shape for `eaglewire plan`, from its config alone (no weights).

A user sizing a 70B or a 1T MoE run has the config.json long before the
weights, so everything here reads the config only. The parameter count comes
from transformers itself when it knows the architecture: the model is built on
the `meta` device (shapes without storage), which counts exactly what
`from_pretrained` would allocate, tied embeddings and fused experts included.
Architectures transformers does not know (remote code) fall back to a formula
over the usual config fields, and the result says which fields it read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.hfconfig import EXPERT_KEYS, Fields, geometry, text_config
from eaglewire.targets.load import (
    check_gguf,
    gguf_cache_dir,
    gguf_source,
    quiet_transformers,
    resolve_target_dir,
)

_EXPERTS = re.compile(r"(^|\.)experts\.")  # routed experts; `shared_experts.` does not match


def read_config_json(path: Path) -> dict:
    """`--model-config`: a config.json file, or a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise EaglewireError(f"--model-config {path}: no such file (expected an HF config.json or a directory holding one)")
    try:
        raw = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EaglewireError(f"--model-config {p}: not a JSON config ({e})") from e
    if not isinstance(raw, dict):
        raise EaglewireError(f"--model-config {p}: expected a JSON object (an HF config.json)")
    return raw


def target_config(source: str) -> dict:
    """The config of a target as other commands name it, without loading its weights."""
    gguf = gguf_source(source)
    if gguf is not None:
        check_gguf(gguf)
        d = gguf_cache_dir(gguf)
        if (d / "config.json").is_file():
            return read_config_json(d)

        quiet_transformers()  # AutoConfig reads the GGUF metadata only (no conversion, no tensors)
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False).to_dict()
    return read_config_json(resolve_target_dir(source))


def _attention_params(f: Fields, g: dict) -> int:
    H, nh, nkv, hd = g["hidden_size"], g["num_heads"], g["num_kv_heads"], g["head_dim"]
    kv_lora = f.get("kv_lora_rank")
    if not kv_lora:
        mt = str(f.raw.get("model_type", ""))
        qkv_bias = mt.startswith("qwen2") or f.get("attention_bias", default=False)  # Qwen2 has q/k/v biases always
        bias = (nh + 2 * nkv) * hd if qkv_bias else 0
        bias += H if f.get("attention_bias", default=False) else 0  # o_proj bias
        qk_norm = 2 * hd if mt.startswith("qwen3") else 0  # Qwen3's per-head q/k RMSNorm
        return H * nh * hd + 2 * H * nkv * hd + nh * hd * H + bias + qk_norm
    rope, nope, v = (f.count(k, required=True, hi=H) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    q_lora = f.get("q_lora_rank")
    q = H * q_lora + q_lora + q_lora * nh * (nope + rope) if q_lora else H * nh * (nope + rope)
    return q + H * (kv_lora + rope) + kv_lora + kv_lora * nh * (nope + v) + nh * v * H


def _moe_layers(f: Fields, L: int) -> int:
    first_dense = int(f.get("first_k_dense_replace", default=0))
    step = int(f.get("decoder_sparse_step", "moe_layer_freq", default=1) or 1)
    dense_only = set(f.get("mlp_only_layers", default=[]) or [])
    return sum(1 for i in range(L) if i >= first_dense and (i + 1) % step == 0 and i not in dense_only)


def formula_count(raw: dict, where: str = "config") -> dict:
    """Parameter count from the usual fields (decoder-only, gated MLP, RMSNorm): the fallback."""
    f = Fields(text_config(raw), where)
    g = geometry(f)
    H, L, V = g["hidden_size"], g["num_layers"], g["vocab_size"]
    attn = _attention_params(f, g) + 2 * H  # + the two norms of a layer
    dense_mlp = 3 * H * g["intermediate_size"]
    n_moe = _moe_layers(f, L) if g["num_experts"] else 0
    expert = shared = router = 0
    if n_moe:
        I_e = int(f.get("moe_intermediate_size", "expert_intermediate_size", default=g["intermediate_size"]))
        expert = 3 * H * I_e
        shared = int(f.get("n_shared_experts", default=0) or 0) * 3 * H * I_e
        if f.get("shared_expert_intermediate_size"):
            shared += 3 * H * int(f.get("shared_expert_intermediate_size")) + H  # + its sigmoid gate
        router = H * g["num_experts"]
        g["expert_intermediate_size"] = I_e
    routed = n_moe * g["num_experts"] * expert
    total = (L * attn + (L - n_moe) * dense_mlp + n_moe * (shared + router) + routed
             + V * H * (1 if g["tie_word_embeddings"] else 2) + H)
    active = total - routed + n_moe * g["experts_per_token"] * expert
    return {**g, "num_parameters": total, "active_parameters": active, "routed_expert_parameters": routed,
            "method": "formula", "fields_used": sorted(set(f.used))}


def meta_count(raw: dict) -> dict | None:
    """Exact count by building the model on the meta device; None when transformers cannot."""
    quiet_transformers()
    kw = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "auto_map")}
    try:
        cfg = AutoConfig.for_model(raw.get("model_type", ""), **kw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except Exception:  # unknown architecture or remote code: the formula decides
        return None
    n_exp = int(next((raw[k] for k in EXPERT_KEYS if text_config(raw).get(k)), 0) or 0)
    total = routed = 0
    for name, p in model.named_parameters():  # unique tensors: a tied lm_head is counted once
        total += p.numel()
        routed += p.numel() if n_exp and _EXPERTS.search(name) else 0
    return {"num_parameters": total, "routed_expert_parameters": routed, "architecture": type(model).__name__}


def target_shape(raw: dict, where: str) -> dict:
    """Geometry (formula fields) with the exact meta-device count when transformers knows the arch."""
    shape = formula_count(raw, where)
    exact = meta_count(raw)
    if exact:
        formula_total = shape["num_parameters"]
        frac = shape["experts_per_token"] / shape["num_experts"] if shape["num_experts"] else 0.0
        shape.update(exact, method="meta-device model (transformers)", formula_parameters=formula_total,
                     active_parameters=int(exact["num_parameters"] - exact["routed_expert_parameters"] * (1 - frac)))
    shape["model_type"] = text_config(raw).get("model_type")
    return shape


def drafter_shape(raw: dict, num_aux: int, draft_vocab: int, freeze_head: bool) -> dict:
    """The drafter `train` would build for this target, counted on the meta device."""
    ns = SimpleNamespace(**text_config(raw))
    try:
        dcfg = DrafterConfig.from_target_config(ns, draft_vocab_size=draft_vocab, num_aux=num_aux)
    except (ValueError, TypeError, AttributeError) as e:
        raise EaglewireError(f"config: cannot derive the drafter's shape ({e})") from e
    with torch.device("meta"):
        m = Eagle3Drafter(dcfg)
    frozen = {"embed_tokens.weight"} | ({"lm_head.weight"} if freeze_head else set())
    counts = {n: p.numel() for n, p in m.named_parameters()}
    trainable = sum(v for n, v in counts.items() if n not in frozen)
    return {"num_parameters": sum(counts.values()), "trainable_parameters": trainable,
            "frozen_parameters": sum(counts.values()) - trainable, "draft_vocab_size": draft_vocab,
            "matmul_parameters": sum(v for n, v in counts.items() if n.endswith(".weight") and n != "embed_tokens.weight"
                                     and "norm" not in n), "intermediate_size": dcfg.intermediate_size}
