"""Hybrid targets (Qwen3-Next, Qwen3.5): which capture points fall on linear-attention layers, and whether
each engine captures there.

Why say it: on a hybrid target most decoder layers are gated-delta-net (linear attention) layers, so the
EAGLE-3 default points usually land on them. A reader who knows that engines special-case those layers
(their own caches, their own kernels) must not have to guess whether the features a drafter is fed there are
the ones it was trained on. Read from the pinned engines' capture loops, every one of them captures at a
linear-attention layer exactly as at a full-attention one:

- vLLM 0.32.0, model_executor/models/qwen3_next.py `Qwen3NextModel.forward`: `_maybe_add_hidden_state` after
  every layer of the stack, whatever its `layer_type` (qwen3_5.py's `Qwen3_5Model` inherits that forward);
- SGLang 0.5.23, models/qwen3_next.py and qwen3_5.py: the linear-attention decoder layers
  (`Qwen3HybridLinearDecoderLayer`, `Qwen3_5LinearDecoderLayer`) pass `captured_last_layer_outputs` to
  `prepare_attn_and_capture_last_layer_outputs` as the attention layers do;
- llama.cpp 0.3.36, src/models/qwen3next.cpp and qwen35.cpp: `res->t_layer_inp[il] = inpL` at the top of
  every layer, before the `is_recr(il)` branch.
"""

from __future__ import annotations

from eaglewire.targets.points import Point
from eaglewire.targets.registry import pinned_version

FULL_KINDS = frozenset({"full_attention", "sliding_attention", "attention"})

# engine label -> (captures at a linear-attention layer, where that was read)
LINEAR_CAPTURE = {
    f"sglang {pinned_version('sglang')}": (True, "models/qwen3_next.py, qwen3_5.py: linear decoder layers capture too"),
    f"vllm {pinned_version('vllm')}": (True, "models/qwen3_next.py: Qwen3NextModel.forward captures after every layer"),
    f"llama.cpp {pinned_version('llama.cpp')}": (True, "src/models/qwen3next.cpp, qwen35.cpp: t_layer_inp on every "
                                                       "layer"),
}


def point_layer_types(config, points: list[Point]) -> dict[str, str]:
    """{point: the `layer_types` entry of the layer that writes it} for each layer point the config covers.

    `config` is the language model's config (its `layer_types`, as transformers fills it for Qwen3-Next and
    Qwen3.5's text config); {} for a config without one."""
    kinds = getattr(config, "layer_types", None) or []
    return {p.name: kinds[p.layer] for p in points if p.kind == "layer" and p.layer < len(kinds)}


def is_hybrid(config) -> bool:
    """Layers of more than one kind (attention and linear attention): where a point's layer kind is news."""
    return len(set(getattr(config, "layer_types", None) or [])) > 1


def linear_capture_points(config, points: list[Point]) -> dict[str, dict]:
    """{point: {"layer_type", "engines": {engine: "captures" | "does not capture"}}} for each point written by
    a layer that is not an attention layer (of `point_layer_types`); {} on a target whose layers are all
    attention layers."""
    engines = {e: "captures" if yes else "does not capture" for e, (yes, _) in LINEAR_CAPTURE.items()}
    return {name: {"layer_type": kind, "engines": dict(engines)}
            for name, kind in point_layer_types(config, points).items() if kind not in FULL_KINDS}


def describe(rows: dict[str, dict]) -> list[str]:
    """One human line per point of `linear_capture_points`."""
    return [f"{name} is written by a {r['layer_type']} layer: "
            + ", ".join(f"{e} {v}" for e, v in r["engines"].items()) for name, r in rows.items()]
