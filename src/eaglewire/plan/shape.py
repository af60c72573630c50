"""The target's shape for `eaglewire plan`, from its config alone (no weights).

A user sizing a 70B or a 1T MoE run has the config.json long before the
weights, so everything here reads the config only. The parameter count comes
from transformers itself when it knows the architecture: the model is built on
the `meta` device (shapes without storage), which counts exactly what
`from_pretrained` would allocate, tied embeddings and fused experts included.
What is counted is the language model: a wrapper's (Kimi-K2.5, Qwen3.5, Llama-4,
Qwen3-VL) vision tower is not what eaglewire captures from, and a checkpoint's
`auto_map` is never followed (its family is built with transformers' own class).
Architectures transformers does not know (remote code) fall back to a formula
over the usual config fields, and the result says which fields it read; on
every published family in tests/fixtures/real_configs it equals the meta count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig

import eaglewire.targets.families as families
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.hfconfig import EXPERT_KEYS, MAX_HIDDEN, Fields, geometry, text_config
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
    except RecursionError:  # the decoder recurses once per level: a config is a few levels deep
        raise EaglewireError(f"--model-config {p}: JSON nested too deep to read (expected an HF config.json)") from None
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


def _qk_norm_params(f: Fields, mt: str, nh: int, nkv: int, hd: int) -> int:
    """Per-head q/k RMSNorm weights: Qwen3's and GLM-4-MoE's over a head, MiniMax-M2's over all heads."""
    if mt.startswith("qwen3"):
        return 2 * hd
    if not f.get("use_qk_norm", default=False) or mt.startswith("llama4"):  # Llama-4's is a weightless L2 norm
        return 0
    return (nh + nkv) * hd if f.get("qk_norm_type", default="") == "per_layer" else 2 * hd


def _mla_params(f: Fields, H: int, nh: int) -> int:
    """DeepSeek-V2/V3's latent attention; V3.2's indexer (its own query, key and head weights) on top."""
    rope, nope, v = (f.count(k, required=True, hi=H) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    kv_lora, q_lora = f.count("kv_lora_rank", hi=MAX_HIDDEN), f.get("q_lora_rank")
    q = H * q_lora + q_lora + q_lora * nh * (nope + rope) if q_lora else H * nh * (nope + rope)
    out = q + H * (kv_lora + rope) + kv_lora + kv_lora * nh * (nope + v) + nh * v * H
    if f.get("index_n_heads"):
        n_i, d_i = f.count("index_n_heads", hi=MAX_HIDDEN), f.count("index_head_dim", required=True, hi=MAX_HIDDEN)
        out += (q_lora or H) * n_i * d_i + H * d_i + 2 * d_i + H * n_i  # wq_b, wk, k_norm (LayerNorm), weights_proj
    return out


def _attention_params(f: Fields, g: dict) -> int:
    """One full-attention layer: projections, biases, q/k norms and GPT-OSS's per-head sinks."""
    H, nh, nkv, hd = g["hidden_size"], g["num_heads"], g["num_kv_heads"], g["head_dim"]
    if f.get("kv_lora_rank"):
        return _mla_params(f, H, nh)
    mt = str(f.raw.get("model_type", ""))
    gated = f.get("attn_output_gate", default=mt.startswith(("qwen3_next", "qwen3_5")))  # those two always gate
    q_heads = nh * (2 if gated else 1)  # q_proj emits the output gate beside the queries
    bias_on = bool(f.get("attention_bias", default=False))
    bias = (q_heads + 2 * nkv) * hd if mt.startswith("qwen2") or bias_on else 0  # Qwen2 has q/k/v biases always
    bias += H if bias_on and not mt.startswith("glm4") else 0  # o_proj bias (GLM-4's attention_bias is q/k/v only)
    sinks = nh if mt == "gpt_oss" else 0
    return H * q_heads * hd + 2 * H * nkv * hd + nh * hd * H + bias + _qk_norm_params(f, mt, nh, nkv, hd) + sinks


def _linear_attention_params(f: Fields, H: int) -> int:
    """One Gated DeltaNet layer (Qwen3-Next, Qwen3.5): q/k/v/z/b/a projections, the depthwise conv, the
    per-head decay and step bias, the gated norm and the output projection."""
    nk, dk, nv, dv = (f.count(k, required=True, hi=MAX_HIDDEN) for k in (
        "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim"))
    conv = 2 * nk * dk + nv * dv
    return H * (conv + nv * dv + 2 * nv) + conv * f.count("linear_conv_kernel_dim", default=4) + 2 * nv + dv + nv * dv * H


def _attention_total(f: Fields, g: dict) -> int:
    """Every layer's token mixer and its two norms; hybrid targets list their linear-attention layers."""
    L, H = g["num_layers"], g["hidden_size"]
    kinds = f.get("layer_types", default=[])
    kinds = kinds if isinstance(kinds, list) else []
    n_linear = sum(1 for k in kinds[:L] if k == "linear_attention")
    linear = _linear_attention_params(f, H) if n_linear else 0
    return (L - n_linear) * _attention_params(f, g) + n_linear * linear + L * 2 * H


def _moe_layers(f: Fields, L: int) -> int:
    explicit = f.get("moe_layers")  # Llama-4 may list them
    if isinstance(explicit, list):
        return len({i for i in explicit if isinstance(i, int) and 0 <= i < L})
    first_dense = int(f.get("first_k_dense_replace", default=0))
    step = int(f.get("decoder_sparse_step", "moe_layer_freq", "interleave_moe_layer_step", default=1) or 1)
    dense_only = set(f.get("mlp_only_layers", default=[]) or [])
    return sum(1 for i in range(L) if i >= first_dense and (i + 1) % step == 0 and i not in dense_only)


def _moe_parts(f: Fields, g: dict) -> dict:
    """Per MoE layer: one routed expert, the shared expert(s) and the router (GPT-OSS's experts and router
    carry biases; Llama-4 always adds one shared expert; Qwen gates its shared expert)."""
    H, E = g["hidden_size"], g["num_experts"]
    mt = str(f.raw.get("model_type", ""))
    I_e = f.count("moe_intermediate_size", "expert_intermediate_size", default=g["intermediate_size"])
    g["expert_intermediate_size"] = I_e
    expert = 3 * H * I_e + (2 * I_e + H if mt == "gpt_oss" else 0)
    shared = int(f.get("n_shared_experts", default=0) or 0) * 3 * H * I_e
    if f.get("shared_expert_intermediate_size"):
        shared += 3 * H * f.count("shared_expert_intermediate_size") + H  # + its sigmoid gate
    if mt.startswith("llama4"):
        shared += 3 * H * I_e
    return {"expert": expert, "shared": shared, "router": H * E + (E if mt == "gpt_oss" else 0)}


def formula_count(raw: dict, where: str = "config") -> dict:
    """Parameter count from the usual fields (decoder-only, gated MLP, RMSNorm): the fallback."""
    f = Fields(text_config(raw), where)
    g = geometry(f)
    H, L, V = g["hidden_size"], g["num_layers"], g["vocab_size"]
    dense_mlp = 3 * H * f.count("intermediate_size_mlp", default=g["intermediate_size"])  # Llama-4's dense layers
    n_moe = _moe_layers(f, L) if g["num_experts"] else 0
    moe = _moe_parts(f, g) if n_moe else {"expert": 0, "shared": 0, "router": 0}
    routed = n_moe * g["num_experts"] * moe["expert"]
    total = (_attention_total(f, g) + (L - n_moe) * dense_mlp + n_moe * (moe["shared"] + moe["router"]) + routed
             + V * H * (1 if g["tie_word_embeddings"] else 2) + H)
    active = total - routed + n_moe * g["experts_per_token"] * moe["expert"]
    return {**g, "num_parameters": total, "active_parameters": active, "routed_expert_parameters": routed,
            "attention_parameters": _attention_total(f, g) - L * 2 * H, "shared_expert_parameters": n_moe * moe["shared"],
            "dense_mlp_layers": L - n_moe, "mla": bool(f.raw.get("kv_lora_rank")), "method": "formula", "fields_used": sorted(set(f.used))}


def _language_config(raw: dict):
    """The language model's transformers config, built natively from the dict: a checkpoint's auto_map is
    ignored (no code runs), Kimi-K2's `kimi_k2` reads as DeepSeek-V3, a wrapper gives its text config.
    None when transformers does not implement the family."""
    if families.native_model_type(raw) is None:
        return None
    return families.text_config(families.native_config_from_dict(raw))


def meta_count(raw: dict) -> dict | None:
    """Exact count of the language model, built on the meta device; None when transformers cannot."""
    quiet_transformers()
    try:
        text = _language_config(raw)
        if text is None:
            return None
        with torch.device("meta"):
            model = families.build_causal_lm(text)
    except Exception:  # unknown architecture or remote code: the formula decides
        return None
    tc = text_config(raw)
    n_exp = int(next((tc[k] for k in EXPERT_KEYS if tc.get(k)), 0) or 0)
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
    tc = text_config(raw)
    shape["model_type"] = tc.get("model_type")
    # Linear-attention layers (Qwen3-Next, Qwen3.5) keep a fixed-size state, not a per-token cache
    kinds = tc.get("layer_types") if isinstance(tc.get("layer_types"), list) else []
    shape["kv_cache_layers"] = shape["num_layers"] - sum(1 for k in kinds[:shape["num_layers"]] if k == "linear_attention")
    return shape


def drafter_shape(raw: dict, num_aux: int, draft_vocab: int, freeze_head: bool, intermediate_size: int = 0) -> dict:
    """The drafter `train` would build for this target, counted on the meta device: derived from the same
    transformers config train reads (DeepSeek-V3's sets head_dim to qk_rope_head_dim), else the raw fields."""
    quiet_transformers()
    try:
        ns = _language_config(raw)
    except Exception:  # an unknown or broken family: the raw fields decide, as the formula does
        ns = None
    ns = ns if ns is not None else SimpleNamespace(**text_config(raw))
    extra = {"intermediate_size": intermediate_size} if intermediate_size else {}
    try:
        dcfg = DrafterConfig.from_target_config(ns, draft_vocab_size=draft_vocab, num_aux=num_aux, **extra)
    except (ValueError, TypeError, AttributeError) as e:
        raise EaglewireError(f"config: cannot derive the drafter's shape ({e})") from e
    with torch.device("meta"):
        m = Eagle3Drafter(dcfg)
    frozen = {"embed_tokens.weight"} | ({"lm_head.weight"} if freeze_head else set())
    counts = {n: p.numel() for n, p in m.named_parameters()}
    trainable = sum(v for n, v in counts.items() if n not in frozen)
    return {"num_parameters": sum(counts.values()), "trainable_parameters": trainable,
            "frozen_parameters": sum(counts.values()) - trainable, "draft_vocab_size": draft_vocab, "hidden_size": dcfg.hidden_size,
            "matmul_parameters": sum(v for n, v in counts.items() if n.endswith(".weight") and n != "embed_tokens.weight"
                                     and "norm" not in n), "intermediate_size": dcfg.intermediate_size}
