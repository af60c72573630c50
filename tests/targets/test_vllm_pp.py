"""vLLM over pipeline stages and in its Transformers backend, on real geometries (issue 52).

The rules themselves are executed from the pinned wheel in tests/export/test_vllm_model_files.py; here
the split, the points a served class is fed, and the `--pipeline-parallel-size` flag of `layers` and
`doctor config` on Kimi-K2.5 (61 layers, served with PP 2 on two 8-GPU nodes) with the seeds' ids.
"""

from __future__ import annotations

import ast
import json
from types import SimpleNamespace

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.config import LayersConfig
from eaglewire.targets.layers import convert_layers
from eaglewire.targets.points import (
    EMBED,
    Engine,
    fed_points,
    ids_for_points,
    layer_out,
    points_from_ids,
)
from eaglewire.targets.vllm_pp import pp_stages
from eaglewire_testing.cli import run_cli
from eaglewire_testing.engine_code import compile_function, soft, sources, wheel

pytestmark = pytest.mark.unit

KIMI = "KimiK25ForConditionalGeneration"
L = 61
PP2 = pp_stages(L, 2)
SEED_IDS = [2, 30, 58]


def _vllm(arch):
    return Engine("vllm", "0.32.0", arch)


def test_split_is_get_pp_indices():
    """vllm/distributed/utils.py: the remainder goes to the stages before the last, from the second-to-last."""
    assert PP2.bounds == ((0, 31), (31, 61))
    assert pp_stages(13, 4).bounds == ((0, 3), (3, 6), (6, 10), (10, 13))
    assert pp_stages(14, 4).bounds == ((0, 3), (3, 7), (7, 11), (11, 14))
    assert pp_stages(L, 2, "20,41").bounds == ((0, 20), (20, 61))
    for bad in ("31,31", "61", "x,61", "0,61"):
        with pytest.raises(EaglewireError, match="VLLM_PP_LAYER_PARTITION"):
            pp_stages(L, 2, bad)


def test_kimi_pp2_feeds_only_the_last_stage():
    """deepseek_v2.py's loop keeps only the last stage's captures, by absolute id: 2 and 30 are lost."""
    assert fed_points(SEED_IDS, _vllm(KIMI), L) == [layer_out(1), layer_out(29), layer_out(57)]
    assert fed_points(SEED_IDS, _vllm(KIMI), L, pp=PP2) == [layer_out(57), None, None]
    assert ids_for_points([layer_out(1), layer_out(29), layer_out(57), layer_out(30)], _vllm(KIMI), L, pp=PP2) == \
        [None, None, 58, 31]


def test_a_relaying_loop_keeps_the_one_stage_meaning():
    assert fed_points(SEED_IDS, _vllm("LlamaForCausalLM"), L, pp=PP2) == fed_points(SEED_IDS, "vllm", L)
    assert ids_for_points([layer_out(1)], _vllm("LlamaForCausalLM"), L, pp=PP2) == [2]


@pytest.mark.parametrize("arch, ids, fed, inverse", [
    ("Qwen3_5ForConditionalGeneration", [0, 31, 32, 58], [layer_out(30), layer_out(31), layer_out(57), None], [0, 32, 58, 61]),
    ("MiniMaxM2ForCausalLM", [0, 1, 27, 30, 31], [layer_out(30), layer_out(31), layer_out(57), layer_out(60), None], [0, 1, 27, 30]),
    ("MiMoV2ForCausalLM", [31, 1, 30, 0], [layer_out(30), layer_out(31), layer_out(60), None], [31, 1, 27, 30]),
    ("DeepseekV32ForCausalLM", [31, 61], [layer_out(30), None], [31, 32, 58, None]),
])
def test_each_rule_on_61_layers(arch, ids, fed, inverse):
    """Read from the model files (tests/export): after_start_and_zero, stage_local, mixed, absolute_no_last."""
    got = fed_points(ids, _vllm(arch), L, pp=PP2)
    assert got == fed, got
    if inverse is not None:
        pts = [layer_out(30), layer_out(31), layer_out(57), layer_out(60)]
        assert ids_for_points(pts, _vllm(arch), L, pp=PP2) == inverse


def test_mixed_id_that_feeds_two_slots_is_never_proposed():
    """mimo_v2.py with the last stage at 20: id 20 captures the stage's input AND layer 40's input at once, so
    neither point has an id of its own."""
    stages, eng = pp_stages(L, 2, "20,41"), _vllm("MiMoV2ForCausalLM")
    assert fed_points([20], eng, L, pp=stages) == [layer_out(19), layer_out(39)]
    assert ids_for_points([layer_out(19), layer_out(39), layer_out(40)], eng, L, pp=stages) == [None, None, 21]


def test_transformers_backend_reads_ids_in_written_order_and_no_id_zero():
    """transformers/base.py records `_layer_names[id - 1]` (a dict: id 0 is a KeyError) in the order written."""
    eng = _vllm("Olmo2ForCausalLM")
    assert fed_points([9, 2, 6, 2], eng, 12) == [layer_out(8), layer_out(1), layer_out(5)]
    assert fed_points([0, 12], eng, 12) == [layer_out(11), None]
    assert fed_points([0, 12], "vllm", 12) == [EMBED, layer_out(11)]
    assert ids_for_points([EMBED, layer_out(11)], eng, 12) == [None, 12]
    with pytest.raises(EaglewireError, match="id 0"):
        points_from_ids([0, 3], eng, 12)
    with pytest.raises(EaglewireError, match="Transformers backend"):
        fed_points([2], eng, 12, pp=pp_stages(12, 2))


def test_a_class_whose_loop_is_not_encoded_is_refused():
    for arch in (None, "MiMoForCausalLM", "Glm5NextForCausalLM"):
        with pytest.raises(EaglewireError, match="not encoded"):
            fed_points(SEED_IDS, _vllm(arch), L, pp=PP2)


def test_layers_flag_on_kimi(monkeypatch):
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    res = convert_layers(LayersConfig(ids=SEED_IDS, target_layers=L, layers_from="vllm", arch=KIMI,
                                      pipeline_parallel_size=2))
    assert res["vllm"] == SEED_IDS  # the one-stage table is unchanged
    assert res["vllm_pp"]["stages"] == [[0, 31], [31, 61]] and res["vllm_pp"]["ids"] == [None, None, 58]
    w = "\n".join(res["warnings"])
    assert "does not support eagle3 with pipeline parallelism" in w
    assert "vLLM feeds ids [2, 30, 58] as layers.57.out (2 of them feed nothing)" in w
    assert not any("pipeline" in x or "PP" in x for x in convert_layers(
        LayersConfig(ids=SEED_IDS, target_layers=L, layers_from="vllm", arch=KIMI))["warnings"])
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "30,31")
    res = convert_layers(LayersConfig(ids=SEED_IDS, target_layers=L, layers_from="vllm", arch=KIMI,
                                      pipeline_parallel_size=2))
    assert res["vllm_pp"]["ids"] == [None, 30, 58]


# a drafter for Kimi-K2.5 as published (config.json alone), with the ids at the top level where vLLM reads them
KIMI_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
              "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840, "draft_vocab_size": 32000,
              "eagle_aux_hidden_state_layer_ids": SEED_IDS}


@pytest.fixture
def kimi_drafter(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI_DRAFT))
    return tmp_path


def _doctor(d, *extra):
    r = run_cli("doctor", "config", d, "--engine", "vllm==0.32.0", "--arch", KIMI, "--target-layers", str(L),
                "--trained-points", "layers.1.out,layers.29.out,layers.57.out", "--json", *extra)
    return r, {c["name"]: c for c in json.loads(r.stdout)["checks"]} if r.stdout.strip() else {}


def test_doctor_config_flag_on_kimi(kimi_drafter, monkeypatch):
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    r, rows = _doctor(kimi_drafter)
    assert rows["points"]["ok"] and "pipeline parallel" not in rows
    r, rows = _doctor(kimi_drafter, "--pipeline-parallel-size", "2")
    assert r.returncode == 1 and rows["points"]["ok"] is False
    assert "feeds ['layers.57.out']" in rows["points"]["detail"]
    assert "layers.1.out" in rows["points"]["fix"] and "PP 2" in rows["points"]["fix"]
    assert rows["pipeline parallel"]["level"] == "warning" and "V2 model runner refuses" in rows["pipeline parallel"]["detail"]
    assert "2 -> nothing" in rows["ids capturable"]["detail"]


def test_doctor_config_flag_refusals(kimi_drafter):
    r, _ = _doctor(kimi_drafter, "--pipeline-parallel-size", "62")
    assert r.returncode == 2 and "only 61 layers" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("doctor", "config", kimi_drafter, "--engine", "sglang==0.5.23", "--arch", KIMI, "--target-layers",
                str(L), "--pipeline-parallel-size", "2")
    assert r.returncode == 2 and "only vLLM's capture over pipeline stages" in r.stderr


@pytest.mark.integration
def test_split_equals_the_wheels_own_get_pp_indices():
    """vLLM 0.32.0's `get_pp_indices`, compiled from the pinned wheel's source and run for every stage, against
    `pp_stages`, evenly split and with VLLM_PP_LAYER_PARTITION."""
    name = "vllm/distributed/utils.py"
    src = sources(wheel("vllm"), name)[name]
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "get_pp_indices")

    def split(n, pp, partition=None):
        run = compile_function(src, name, fn, {"envs": SimpleNamespace(VLLM_PP_LAYER_PARTITION=partition),
                                               "logger": soft("logger")})
        return tuple(run(n, r, pp) for r in range(pp))

    checked = 0
    for n in (1, 2, 5, 8, 13, 14, 27, 36, 48, 61, 62, 64, 78, 94):
        for pp in range(1, min(n, 9) + 1):
            assert pp_stages(n, pp).bounds == split(n, pp), (n, pp)
            checked += 1
    assert pp_stages(L, 2, "20,41").bounds == split(L, 2, "20,41")
    assert checked > 80
