"""The P-EAGLE export keys: what they add to the EAGLE-3 configs, and vLLM 0.32.0's own config readers on them."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.formats import build_config
from eaglewire.saved.peagle import (
    speculators_peagle_config,
    vllm_peagle_config,
    vllm_speculative_config,
)
from eaglewire_testing.drafters import V, drafter_config
from eaglewire_testing.engine_code import compile_function, sources, wheel

IDS = [2, 15, 28]  # vLLM meaning, as the EAGLE-3 export writes them


def configs(**overrides) -> tuple[dict, dict]:
    cfg = drafter_config(**overrides)
    return build_config("vllm", cfg, IDS), build_config("speculators", cfg, IDS)


@pytest.mark.unit
def test_vllm_format_adds_the_mask_token_only():
    e3, _ = configs()
    out = vllm_peagle_config(e3, 16)
    assert {k: v for k, v in out.items() if k != "mask_token_id"} == e3 and out["mask_token_id"] == 16
    assert "mask_token_id" not in e3  # a copy: the EAGLE-3 config is left as it was
    assert vllm_speculative_config("/d", 3) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3,
                                                "parallel_drafting": True}


@pytest.mark.unit
def test_speculators_format_is_peagle():
    _, e3 = configs()
    out = speculators_peagle_config(e3, 16, 4)
    assert (out["speculators_model_type"], out["architectures"], out["mask_token_id"]) == ("peagle",
                                                                                          ["PEagleSpeculator"], 16)
    spec = out["speculators_config"]
    assert spec["algorithm"] == "peagle" and spec["proposal_methods"][0]["speculative_tokens"] == 4
    assert out["eagle_aux_hidden_state_layer_ids"] == IDS
    assert e3["speculators_model_type"] == "eagle3"


@pytest.mark.unit
@pytest.mark.parametrize("switch", ["fc_norm", "norm_output"])
def test_speculators_format_refuses_what_vllm_would_drop(switch):
    _, e3 = configs(**{switch: True})
    with pytest.raises(EaglewireError, match=f"drops {switch} from a 'peagle' config.*--format vllm"):
        speculators_peagle_config(e3, 16, 4)


@pytest.mark.unit
@pytest.mark.parametrize("bad", [-1, V, None, "16"])
def test_mask_token_outside_the_vocabulary_is_refused(bad):
    e3, s3 = configs()
    for fn, args in ((vllm_peagle_config, (e3, bad)), (speculators_peagle_config, (s3, bad, 4))):
        with pytest.raises(EaglewireError, match=rf"mask_token_id = {bad!r}: expected .*\[0, {V - 1}\]"):
            fn(*args)


def _vllm_functions() -> dict:
    """vLLM 0.32.0's readers, compiled one by one from the pinned wheel (nothing of vLLM is imported)."""
    want = {"vllm/v1/spec_decode/llm_base_proposer.py": "_init_parallel_drafting_params",
            "vllm/transformers_utils/configs/speculators/base.py": "build_vllm_speculative_config",
            "vllm/transformers_utils/configs/speculators/algos.py": "update_peagle"}
    whl, out = wheel("vllm"), {}
    src = {p: t for path in want for p, t in sources(whl, path).items()}
    for path, name in want.items():
        fn = next(n for n in ast.walk(ast.parse(src[path])) if isinstance(n, ast.FunctionDef) and n.name == name)
        out[name] = compile_function(src[path], path, fn, {"torch": torch})
    return out


def _mask_id(init, cfg: dict):
    """The id the V1 proposer puts in the mask slots, read from the draft's hf_config (extra keys of a
    config.json are attributes of transformers' config, as EAGLEConfig keeps them), or its refusal."""
    hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    s = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf), pass_hidden_states_to_model=True,
                        hidden_size=8, dtype=torch.float32, device="cpu")
    try:
        init(s)
    except ValueError as e:
        return str(e)
    return s.parallel_drafting_token_id


@pytest.mark.integration  # vLLM's own code, from its wheel
def test_vllm_reads_the_export_as_parallel_eagle3():
    """vLLM 0.32.0's own readers, executed: the vllm format's mask id reaches the parallel-drafting proposer (an
    EAGLE-3 config without one is refused at start), the speculators format becomes eagle3 + parallel_drafting
    with the mask as pard_token and the layer ids unchanged."""
    fns = _vllm_functions()
    e3, s3 = configs()
    assert _mask_id(fns["_init_parallel_drafting_params"], vllm_peagle_config(e3, 16)) == 16
    refusal = _mask_id(fns["_init_parallel_drafting_params"], e3)
    assert "must have `dflash_config.mask_token_id`, `mask_token_id`" in refusal
    spec = speculators_peagle_config(s3, 16, 4)
    assert fns["build_vllm_speculative_config"](None, spec) == {"method": "eagle3", "num_speculative_tokens": 4,
                                                                "parallel_drafting": True}
    pre = dict(spec["transformer_layer_config"])
    fns["update_peagle"](spec, pre)
    assert (pre["architectures"], pre["pard_token"], pre["eagle_aux_hidden_state_layer_ids"]) == (
        ["PeagleLlamaForCausalLM"], 16, IDS)
