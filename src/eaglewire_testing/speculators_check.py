"""Run an exported drafter through the real `speculators` Eagle3 model class.

Executed by the speculators venv's python (see speculators_venv.py), never
imported by eaglewire: it must depend on nothing but torch, safetensors and
speculators. Usage: python speculators_check.py EXPORT_DIR INPUTS OUT

INPUTS (safetensors): `features [1, T, A*H]`, `input_ids [1, T]`.
OUT (safetensors): `logits_0`, `logits_1` = draft logits of TTT steps 0 and 1
captured at `lm_head`, as speculators' Eagle3DraftModel.forward computes them.
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def main(export_dir: str, inputs: str, out: str) -> None:
    cfg = Eagle3SpeculatorConfig.from_pretrained(export_dir)
    cfg.transformer_layer_config._attn_implementation = "sdpa"  # flex attention is GPU-oriented
    model = Eagle3DraftModel.from_pretrained(export_dir, config=cfg).float().eval()
    nan = [n for n, p in model.state_dict().items() if p.is_floating_point() and torch.isnan(p).any()
           and not n.startswith("verifier_")]
    if nan:
        raise SystemExit(f"weights left unloaded (NaN-initialised): {nan}")
    x = load_file(inputs)
    T = x["input_ids"].shape[1]
    captured = []
    model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach().clone()))
    with torch.no_grad():
        model(hidden_states=x["features"], input_ids=x["input_ids"], document_ids=torch.zeros(1, T, dtype=torch.long),
              position_ids=torch.arange(T)[None], ttt_steps=2)
    save_file({f"logits_{k}": v.contiguous() for k, v in enumerate(captured)}, out)
    print("speculators", model.__class__.__name__, "steps", len(captured), "ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
