"""Initialise a drafter from its target instead of from noise.

Why: on a CPU budget the drafter sees well under a million training tokens.
Most of its parameters (the draft head, the final norm, a decoder layer) have
a pretrained counterpart in the target, and starting from those saves the
steps a random init spends rediscovering them.

Levels (``train --init``, whose choices `eaglewire.training.cli.INITS` lists):

* ``random``: the official layout, nothing copied (only the frozen embedding).
* ``head``: lm_head rows of the draft vocab and the final norm from the target.
* ``target``: ``head`` plus the EAGLE decoder layer from the target's first layer
  *after* the deepest captured point (the layer the features skip), and fc
  starting as a selection of that deepest slot. At step 0 the drafter then
  computes the target's next layer on the target's own features; training only
  has to learn the shift to the next position and the embedding input.

This is a weight-name mapping from a transformers Llama-style decoder layer to
the drafter's layout, kept out of the model code on purpose.
"""

from __future__ import annotations

import torch

from eaglewire.drafter.model import Eagle3Drafter
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.points import Point


def deepest_layer_slot(points: list[str]) -> int:
    """Index of the deepest ``layers.{k}.out`` point among the captured ones."""
    parsed = [Point.parse(p) for p in points]
    slots = [j for j, p in enumerate(parsed) if p.kind == "layer"]
    if not slots:
        raise ValueError(f"no layers.{{k}}.out point among {points}")
    return max(slots, key=lambda j: parsed[j].layer)


@torch.no_grad()
def init_head(model: Eagle3Drafter, head_weight: torch.Tensor, final_norm: torch.Tensor) -> None:
    """Draft lm_head = the target head's rows of the draft vocab; norm = the target's final norm."""
    ids = model.draft_target_ids().to(head_weight.device)
    model.lm_head.weight.copy_(head_weight[ids].to(model.lm_head.weight))
    model.norm.weight.copy_(final_norm.to(model.norm.weight))


@torch.no_grad()
def _copy_mlp(dst, src) -> None:
    """The target's MLP into the drafter's, which may be wider (`--intermediate-size`).

    The target's units fill the first columns and the extra units keep their
    random gate/up weights with a zero down projection, so at init the wider
    MLP computes exactly the target's and training grows the rest from there.
    """
    i_src, i_dst = src.gate_proj.weight.shape[0], dst.gate_proj.weight.shape[0]
    if i_dst < i_src:
        raise ValueError(f"the drafter's MLP ({i_dst}) is narrower than the target layer it starts from ({i_src}): "
                         "use --init head, or an --intermediate-size of at least the target's")
    for name in ("gate_proj", "up_proj"):
        getattr(dst, name).weight[:i_src].copy_(getattr(src, name).weight.to(getattr(dst, name).weight))
    dst.down_proj.weight.zero_()
    dst.down_proj.weight[:, :i_src].copy_(src.down_proj.weight.to(dst.down_proj.weight))


_LLAMA_PARTS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def not_llama_shaped(layer) -> str | None:
    """Why a target decoder layer has no Llama counterpart to copy (MLA attention, a mixture of experts, a
    linear-attention layer), or None when it has one."""
    for part, names in _LLAMA_PARTS.items():
        mod = getattr(layer, part, None)
        if mod is None:
            return f"has no {part} ({type(layer).__name__}: e.g. a linear-attention layer)"
        if missing := [n for n in names if not isinstance(getattr(mod, n, None), torch.nn.Linear)]:
            return f"has a {type(mod).__name__} {part} without {missing[0]} (MLA, experts or sinks)"
    return None


@torch.no_grad()
def init_from_target_layer(model: Eagle3Drafter, target_model, points: list[str], deepest_scale: float) -> int:
    """Copy the target layer after the deepest captured point into the EAGLE layer; returns its index.

    The EAGLE layer's q/k/v read cat(embed, hidden) [2H]: the hidden half gets
    the target's projections and the embedding half starts at zero, so at init
    the layer is exactly the target's layer applied to the deepest slot.
    ``deepest_scale`` is the typical norm/sqrt(H) of that slot (with ``fc_norm``) or of the whole fc input
    (with ``norm_before_fc``): the slot arrives normalised, and the fc selection restores its scale so
    the residual stream has the magnitude the copied layer expects.
    """
    layers = decoder_stack(target_model).layers
    slot = deepest_layer_slot(points)
    src_idx = Point.parse(points[slot]).layer + 1
    if src_idx >= len(layers):
        raise ValueError(f"no target layer after the deepest captured point of {points}")
    src, dst = layers[src_idx], model.decoder_layers[0]
    if why := not_llama_shaped(src):
        raise ValueError(f"target layer {src_idx} {why}, which the drafter's Llama layer cannot start from; "
                         "use --init head")
    h = model.config.hidden_size
    for name in ("q_proj", "k_proj", "v_proj"):
        w = getattr(dst.self_attn, name).weight  # [out, 2H], embed half first
        w.zero_()
        w[:, h:].copy_(getattr(src.self_attn, name).weight.to(w))
    dst.self_attn.o_proj.weight.copy_(src.self_attn.o_proj.weight.to(dst.self_attn.o_proj.weight))
    _copy_mlp(dst.mlp, src.mlp)
    dst.hidden_norm.weight.copy_(src.input_layernorm.weight.to(dst.hidden_norm.weight))
    dst.input_layernorm.weight.fill_(1.0)
    dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight.to(dst.post_attention_layernorm.weight))
    fc = model.fc.weight  # [H, A*Ht]
    ht = model.config.target_hidden_size
    fc.zero_()
    scale = deepest_scale if model.config.fc_norm or model.config.norm_before_fc else 1.0
    fc[:, slot * ht:(slot + 1) * ht].copy_(torch.eye(h, ht) * scale)
    return src_idx
