"""Bytes per weight of a quantized target, read from its `quantization_config` (no weights).

A 1T MoE whose routed experts ship in int4 needs a quarter of the devices its
bf16 count suggests: a plan that sizes every checkpoint in bf16 sends a node
owner to four nodes when one serves it. The formats read are the ones the
published large MoEs ship in, as vLLM and SGLang load them:

* compressed-tensors (Kimi-K2.5: int4 routed experts, group 32, bf16 scales,
  an `ignore` list keeping attention, shared experts, dense MLPs and lm_head in bf16);
* fp8 block (DeepSeek-V3, Kimi-K2, MiniMax-M2: `quant_method: fp8`,
  `weight_block_size [128, 128]`, one fp32 scale per block);
* ModelOpt NVFP4 (`quant_algo: NVFP4`: 4-bit values, one fp8 scale per 16) and FP8;
* MXFP4 (GPT-OSS: 4-bit values, one e8m0 scale per 32), GPTQ/AWQ (`bits`, `group_size`).

Bytes are counted per parameter group (routed experts, attention, the rest of
the layers, embedding, lm_head), each group quantized or not as its
representative module name matches the checkpoint's ignore list. Embeddings are
never quantized (every format above targets Linear layers); norms and routers
ride in "the rest" at that group's width (a few MB on a 1T target).
"""

from __future__ import annotations

import fnmatch
import math
import re

from eaglewire.infra.errors import EaglewireError

BF16 = 2.0


def _num(d: dict, key: str, default: float, where: str) -> float:
    """A size field of the quantization_config: a positive finite number, else one line naming it."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf) or (v > 1 << 20):
        raise EaglewireError(f"config: quantization_config {where}{key} = {str(v)[:40]!r}: expected a positive number")
    return float(v)


def _matches(name: str, pattern: str) -> bool:
    """A module name against one ignore entry: `re:` regex (compressed-tensors), glob, or dotted component path."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return f".{name}.".find(f".{pattern}.") >= 0


def _skipped(name: str, ignore: list) -> bool:
    return any(isinstance(p, str) and _matches(name, p) for p in ignore)


def _compressed_tensors(q: dict) -> tuple[float, str]:
    """Bytes per quantized weight of the first weight scheme: values plus one scale (and zero point) per group."""
    groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
    w = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)),
             None)
    if not w:
        return BF16, "compressed-tensors without a weight scheme: sized as bf16"
    bits = _num(w, "num_bits", 16, "weights.")
    group = int(_num(w, "group_size", 0, "weights.")) if w.get("strategy") in ("group", "tensor_group") else 0
    scale = 1.0 if w.get("type") == "float" and bits == 4 else BF16  # NVFP4 in compressed-tensors: fp8 scales
    zero = 0.0 if w.get("symmetric", True) else bits / 8
    per = bits / 8 + ((scale + zero) / group if group else 0.0)
    return per, f"compressed-tensors {w.get('type', 'int')}{bits:g}" + (f", group {group}" if group else "")


def scheme(q: dict | None) -> dict:
    """The checkpoint's quantization: bytes per quantized weight, the ignore list, and the line saying so."""
    if not isinstance(q, dict) or not q:
        return {"name": "none", "bytes": BF16, "ignore": [], "note": "no quantization_config: weights in bf16"}
    method = str(q.get("quant_method", "")).lower()
    ignore = [p for key in ("ignore", "modules_to_not_convert", "exclude_modules")
              for p in (q.get(key) or []) if isinstance(p, str)]
    algo = str(q.get("quant_algo", "")).upper()
    if method == "compressed-tensors":
        per, what = _compressed_tensors(q)
    elif method == "fp8":
        blk = q.get("weight_block_size")
        n = blk[0] * blk[1] if isinstance(blk, list) and len(blk) == 2 and all(isinstance(b, int) for b in blk) else 0
        per, what = (1 + 4 / n, f"fp8 block {blk[0]}x{blk[1]} (fp32 scale per block)") if n else (1.0, "fp8 per tensor")
        ignore = ignore + ["lm_head"]  # fp8 checkpoints keep lm_head in bf16 (transformers' and vLLM's default)
    elif method == "modelopt" and algo == "NVFP4":
        g = int(_num(q, "group_size", 16, ""))
        per, what = 0.5 + 1 / g, f"ModelOpt NVFP4 (4-bit, fp8 scale per {g})"
    elif method == "modelopt" and algo.startswith("FP8"):
        per, what = 1.0, "ModelOpt FP8"
    elif method == "mxfp4":
        per, what = 0.5 + 1 / 32, "MXFP4 (4-bit, e8m0 scale per 32)"
        ignore = ignore + ["lm_head"]
    elif method in ("gptq", "awq") and q.get("bits"):
        bits = _num(q, "bits", 4, "")
        g = int(q["group_size"]) if q.get("group_size") == -1 else int(_num(q, "group_size", 128, ""))
        per, what = bits / 8 + (BF16 + bits / 8) / g if g > 0 else bits / 8, f"{method} int{bits:g}, group {g}"
        ignore = ignore + ["lm_head"]
    else:
        return {"name": method or "unknown", "bytes": BF16, "ignore": [],
                "note": f"quantization_config quant_method {method or '?'!r} is not read by plan: sized as bf16"}
    return {"name": what, "bytes": per, "ignore": ignore, "note": f"weights: {what}, {per:.4g} B per quantized weight"}


def quantization_config(raw: dict) -> dict | None:
    """A wrapper's (Kimi-K2.5) quantization_config may sit under text_config."""
    for d in (raw, raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}):
        if isinstance(d.get("quantization_config"), dict):
            return d["quantization_config"]
    return None


def _representatives(s: dict) -> dict[str, list[str]]:
    """One module name per parameter group, as HF checkpoints name them (what ignore lists are written against)."""
    last = s["num_layers"] - 1
    rest = []
    if s.get("shared_expert_parameters"):
        rest.append(f"model.layers.{last}.mlp.shared_experts.gate_proj")
    if s.get("dense_mlp_layers"):
        rest.append("model.layers.0.mlp.gate_proj")
    return {"routed_experts": [f"model.layers.{last}.mlp.experts.0.gate_proj"],
            "attention": ["model.layers.0.self_attn.o_proj"], "rest": rest, "lm_head": ["lm_head"]}


def weight_bytes(s: dict, sch: dict) -> dict:
    """Bytes of the target's weights per group under `sch`; embedding and norms-only groups stay bf16."""
    V, H = s["vocab_size"], s["hidden_size"]
    embed = V * H
    head = 0 if s.get("tie_word_embeddings") else V * H
    attention = min(s.get("attention_parameters", 0), s["num_parameters"])
    routed = s["routed_expert_parameters"]
    counts = {"routed_experts": routed, "attention": attention, "embed": embed, "lm_head": head,
              "rest": max(0, s["num_parameters"] - routed - attention - embed - head)}
    reps = _representatives(s)
    out = {"scheme": sch["name"], "quantized_bytes_per_weight": sch["bytes"], "groups": {}}
    for g, n in counts.items():
        names = reps.get(g, [])
        quant = sch["name"] != "none" and bool(names) and not any(_skipped(x, sch["ignore"]) for x in names)
        out["groups"][g] = {"parameters": n, "quantized": quant, "bytes": int(n * (sch["bytes"] if quant else BF16))}
    out["total_bytes"] = sum(v["bytes"] for v in out["groups"].values())
    return out
