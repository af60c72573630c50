"""A tiny checkpoint in compressed-tensors' pack-quantized layout, for tests of what reads it by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglewire.targets.load import resolve_target_dir


def quantized_copy(src_arch: str, d: Path) -> Path:
    """A copy of a tiny checkpoint in compressed-tensors' pack-quantized layout: every decoder linear stored
    as int32 `weight_packed` + bf16 `weight_scale` + `weight_shape`, the embedding and head bf16, and a
    quantization_config in config.json (as Kimi-K2.5 ships: int4 experts, bf16 embedding and head)."""
    shutil.copytree(resolve_target_dir(f"tiny:{src_arch}"), d)
    for fp in sorted(d.glob("*.safetensors")):
        out = {}
        for k, v in load_file(str(fp)).items():
            if ".layers." in k and k.endswith(".weight") and v.dim() == 2:
                base = k[: -len(".weight")]
                out[base + ".weight_packed"] = torch.zeros(v.shape[0], max(1, v.shape[1] // 8), dtype=torch.int32)
                out[base + ".weight_scale"] = torch.ones(v.shape[0], 1, dtype=torch.bfloat16)
                out[base + ".weight_shape"] = torch.tensor(list(v.shape))
            elif k.endswith(("embed_tokens.weight", "lm_head.weight")):
                out[k] = v.to(torch.bfloat16)
            else:
                out[k] = v
        save_file(out, str(fp), metadata={"format": "pt"})
    raw = json.loads((d / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                      "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                      "group_size": 32}}},
                                  "ignore": ["lm_head", "re:.*embed_tokens.*"]}
    (d / "config.json").write_text(json.dumps(raw, indent=1))
    return d
