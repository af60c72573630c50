"""Our SGLang and vLLM exports against their loaders' rules, read from their source.

Both engines are GPU-only, so their loaders are re-stated here as small
functions and applied to our exported names and configs. Sources read:

* SGLang: sgl-project/sglang, python/sglang/srt/models/llama_eagle3.py at
  03d5a7771f6082e7737a5f19cae7d1e863087013. `LlamaForCausalLMEagle3.load_weights`:
  a name containing "d2t" sets hot_token_id = d2t + arange (OFFSETS); "t2d"
  is skipped; q/k/v_proj -> qkv_proj and gate/up_proj -> gate_up_proj; the
  name is used as is or with "model." prefixed; a name matching no parameter
  is silently skipped (hence this test). Parameters: model.embed_tokens,
  model.fc (in = target_hidden_size * 3, bias = config.bias or False),
  model.midlayer.{self_attn.qkv_proj, self_attn.o_proj, mlp.gate_up_proj,
  mlp.down_proj, input_layernorm, hidden_norm, post_attention_layernorm},
  model.norm, lm_head. The midlayer takes the raw hidden state as residual.
  Ids: eagle_config.eagle_aux_hidden_state_layer_ids (nested).
* vLLM: vllm-project/vllm, vllm/model_executor/models/llama_eagle3.py at
  00bd1493b3e82d6c13c68ee8a0e1c5a96707e190. `Eagle3LlamaForCausalLM.load_weights`:
  "t2d" skipped, "d2t" -> draft_id_to_target_id (offsets: targets = arange + d2t
  in compute_logits), non-lm_head names get "model."; `LlamaModel.load_weights`:
  "midlayer." -> "layers.0.", stacked qkv/gate_up, `params_dict[name]` (KeyError
  on an unknown name). Layer 0 q/k/v take 2H, later layers H. fc in =
  target_hidden_size * 3. norm_before_residual: getattr(config, ..., False).
  vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py at
  da84445036cc0892da52c329f330064cba1a46ab: `get_eagle3_aux_layers_from_config`
  reads only the top-level hf_config.eagle_aux_hidden_state_layer_ids, else the
  model default. Speculators configs: vllm/transformers_utils/configs/
  speculators/algos.py (neuralmagic/vllm at 8ab0bfc5f202938a4b5e8a7d56b868bd6ac794e6)
  `update_eagle3`: norm_before_residual defaults to TRUE when absent, the
  top-level ids are copied, architectures = Eagle3LlamaForCausalLM.
* Registry (vllm/model_executor/models/registry.py): "LlamaForCausalLMEagle3"
  -> ("llama_eagle3", "Eagle3LlamaForCausalLM").

Not verified here: running either engine (GPU-only); SGLang's multi-layer
naming (additional_layers.*) is refused by the exporter instead.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.targets.points import ids_for_points, parse_points
from eaglewire_testing.export_helpers import VERIFIER, L, make_ckpt

_STACK = [(".qkv_proj", ".q_proj"), (".qkv_proj", ".k_proj"), (".qkv_proj", ".v_proj"),
          (".gate_up_proj", ".gate_proj"), (".gate_up_proj", ".up_proj")]
_LAYER = ["self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
          "input_layernorm.weight", "post_attention_layernorm.weight"]


def _stack(name):
    for new, old in _STACK:
        if old in name:
            return name.replace(old, new)
    return name


def sglang_load(names):
    """Which SGLang parameter each weight name lands in (None = silently skipped)."""
    params = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight",
              *[f"model.midlayer.{p}" for p in _LAYER + ["hidden_norm.weight"]]}
    out = {}
    for n in names:
        if "d2t" in n or "t2d" in n:
            continue
        n2 = _stack(n)
        out[n] = n2 if n2 in params else (f"model.{n2}" if f"model.{n2}" in params else None)
    return out, params


def vllm_load(names, num_layers):
    params = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight",
              "draft_id_to_target_id", *[f"model.layers.{i}.{p}" for i in range(num_layers)
                                         for p in _LAYER + ["hidden_norm.weight"]]}
    out = {}
    for n in names:
        if "t2d" in n:
            continue
        if "d2t" in n:
            out[n] = "draft_id_to_target_id"
            continue
        n2 = n if "lm_head" in n else "model." + n.replace("midlayer.", "layers.0.")
        n2 = _stack(n2)
        if n2 not in params:
            raise KeyError(n2)  # vLLM: params_dict[name]
        out[n] = n2
    return out, params


def test_sglang_loads_every_tensor(tmp_path):
    ck, m = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="sglang", out=tmp_path / "s"))
    sd = load_file(str(tmp_path / "s" / "model.safetensors"))
    got, params = sglang_load(sd)
    assert None not in got.values(), {k for k, v in got.items() if v is None}
    assert set(got.values()) == params  # every SGLang parameter is filled
    hot = sd["d2t"] + torch.arange(sd["d2t"].shape[0])
    assert torch.equal(hot, m.draft_target_ids())
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["target_hidden_size"] * 3 == sd["fc.weight"].shape[1]
    pts = parse_points(json.loads((tmp_path / "s" / "eaglewire.export.json").read_text())["points"], L)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids_for_points(pts, "sglang", L)
    assert "bias" not in cfg or cfg["bias"] is False


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_vllm_loads_every_tensor(tmp_path, fmt, num_layers):
    ck, m = make_ckpt(tmp_path / "ck", num_layers=num_layers, norm_before_residual=True)
    run_export(ExportConfig(ckpt=ck, format=fmt, verifier=VERIFIER, out=tmp_path / "v"))
    sd = load_file(str(tmp_path / "v" / "model.safetensors"))
    got, params = vllm_load(sd, num_layers)
    unfilled = params - set(got.values())
    assert unfilled == {f"model.layers.{i}.hidden_norm.weight" for i in range(1, num_layers)}  # unused by vLLM
    assert sd["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * m.config.hidden_size
    if num_layers == 2:
        assert sd["layers.1.self_attn.q_proj.weight"].shape[1] == m.config.hidden_size
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["norm_before_residual"] is True  # explicit: vLLM's default is False here, True for speculators
    top = cfg["eagle_aux_hidden_state_layer_ids"]
    pts = parse_points(json.loads((tmp_path / "v" / "eaglewire.export.json").read_text())["points"], L)
    assert top == ids_for_points(pts, "vllm", L) == [2, 4, 5]


def test_vllm_nested_ids_would_be_ignored(tmp_path):
    """Our vLLM config never relies on the nested key, which vLLM ignores."""
    ck, _ = make_ckpt(tmp_path / "ck")
    run_export(ExportConfig(ckpt=ck, format="vllm", out=tmp_path / "v"))
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
