"""The bodies of `inspect` and `capture` as functions returning their results (targets/cli.py prints them).

Why apart from the CLI: other stages and tests want a target described or a
capture written without typer or parsing printed text, and a new fact about a
target (a field of `inspect`) is one line here, which the CLI then shows.
`layers` loads nothing and lives in targets/layers.py, so that it starts without torch.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import save_file

import eaglewire.targets.families as families
from eaglewire.infra.device import resolve_device, resolve_dtype
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.chat import apply_chat_template
from eaglewire.targets.config import CaptureConfig, InspectConfig
from eaglewire.targets.fingerprint import chat_template_hash
from eaglewire.targets.hybrid import is_hybrid, linear_capture_points, point_layer_types
from eaglewire.targets.layers import engine_support
from eaglewire.targets.load import Target, checked_target_dir, load_target, resolve_target_dir
from eaglewire.targets.points import (
    eagle3_default,
    id_lists,
    point_option,
)


def inspect_target(cfg: InspectConfig) -> dict:
    """What `inspect` reports: the target, which engines can capture from it, and its default capture's ids."""
    t = config_only(cfg.target) or load_target(cfg.target, device=resolve_device(cfg.device))
    pts = eagle3_default(t.num_layers)
    ids = id_lists(pts, t.num_layers)
    res = {
        "target": cfg.target,
        "path": str(t.path),
        "architecture": t.arch,  # what the engines dispatch on (a wrapper's class)
        "language_model": f"{type(t.model).__name__} ({t.config.model_type})",
        "model_type": t.config.model_type,
        "layer_types": layer_types(t.config, pts),
        "linear_capture": linear_capture_points(t.config, pts),  # hybrids: points on linear-attention layers
        "engines": engine_support(t.arch),
        "num_layers": t.num_layers,
        "hidden_size": t.hidden_size,
        "vocab_size": t.vocab_size,
        "num_parameters": sum(p.numel() for p in t.model.parameters()),
        "chat_template": bool(getattr(t.tokenizer, "chat_template", None)),
        "chat_template_sha": chat_template_hash(t.tokenizer) if t.tokenizer is not None else None,
        "eos_token_ids": t.eos_ids() if t.tokenizer is not None else None,
        "weights": t.tokenizer is not None or any(t.path.glob("*.safetensors")),
        "default_capture": {"names": ids["names"], "hf_index": ids["hf_index"], "sglang": ids["sglang"],
                            "vllm": ids["vllm"], "specforge": ids["specforge"], "speculators": ids["speculators"],
                            "sglang_deepseek": ids["sglang_deepseek"], "llama.cpp": ids["llama.cpp"]},
    }
    return res


def capture_text(cfg: CaptureConfig) -> dict:
    """`capture`: the target's tensors at the points for one text, written to cfg.out (safetensors)."""
    dev = resolve_device(cfg.device)
    t = load_target(cfg.target, device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    pts = point_option(cfg.points, t.num_layers)
    if cfg.chat:
        ids = apply_chat_template(t.tokenizer, [{"role": "user", "content": cfg.text}], add_generation_prompt=True,
                                              return_dict=True)["input_ids"]
    else:
        ids = t.tokenizer(cfg.text)["input_ids"]
    if not ids:
        raise EaglewireError("--text: tokenizes to no tokens")
    input_ids = torch.tensor([ids], device=dev)
    feats = capture(t.model, input_ids, pts)
    tensors = {n: v[0].float().cpu().contiguous() for n, v in feats.items()}
    tensors["input_ids"] = input_ids[0].cpu()
    meta = {"target": cfg.target, "points": json.dumps(id_lists(pts, t.num_layers))}
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(cfg.out), metadata=meta)
    res = {"out": str(cfg.out), "num_tokens": len(ids), "points": [p.name for p in pts],
           "norms": {n: float(v.norm(dim=-1).median()) for n, v in tensors.items() if n != "input_ids"}}
    return res


def config_only(source: str):
    """A Target built on the meta device from config.json alone, when the directory holds no weights: a
    published config (Kimi-K2.5's 1T parameters) is described without downloading a shard. None otherwise."""
    if source.startswith("tiny:") or source == "default" or source.endswith(".gguf"):
        return None
    path = resolve_target_dir(source)
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return None
    checked_target_dir(path)
    with torch.device("meta"):
        model = families.build_causal_lm(families.text_config(families.native_config(path)))
    print(f"note: {path} holds no weights: described from config.json alone (no tokenizer, no chat template)",
          file=sys.stderr)
    return Target(source=source, path=path, model=model, tokenizer=None, serving_arch=families.serving_arch(path))


def layer_types(config, pts) -> dict[str, str]:
    """{point: the kind of layer that writes it} on hybrid targets (Qwen3-Next, Qwen3.5: linear attention
    between full-attention layers), so a reader sees which captured states come from linear-attention layers;
    {} where every layer is of one kind."""
    return point_layer_types(config, pts) if is_hybrid(config) else {}
