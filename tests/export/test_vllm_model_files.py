"""vLLM's EAGLE-3 truth per target family, executed from the pinned wheel's own model files.

1. Which target classes vLLM (and SGLang) can capture from at all: re-derived from the wheels'
   source and compared with `eaglewire.targets.support` (a version bump that changes them fails).
2. Every capture loop (a model's `forward` that reads `aux_hidden_state_layers`) in the files of
   the EAGLE-3 target classes and their bases, run on stub layers for many id lists, on one
   pipeline stage and split over two, against `points.fed_points`.
3. Every EAGLE-3 target class's default ids against `points.default_points`.

How the code runs: src/eaglewire_testing/vllm_code.py. Under pipeline parallelism and in the
Transformers backend vLLM reads ids per model file: points.py takes the rule from
eaglewire.targets.vllm_pp, and each rule is also pinned here by an independent formula.
"""

from __future__ import annotations

import ast
import random

import pytest

from eaglewire.targets.points import (
    EMBED,
    PINNED,
    Engine,
    default_points,
    fed_points,
    layer_out,
    points_from_ids,
)
from eaglewire.targets.support import (
    SGLANG_EAGLE3_ARCHS,
    SGLANG_NO_EAGLE3_ARCHS,
    VLLM_EAGLE3_ARCHS,
    VLLM_NO_EAGLE3_ARCHS,
    VLLM_REFUSAL,
)
from eaglewire.targets.vllm_pp import DECODER_RULES, SERVED_BY, TRANSFORMERS_BACKEND_ARCHS, Stages
from eaglewire_testing.engine_code import SET_LAYERS, Package, Stream, sources, wheel
from eaglewire_testing.vllm_code import (
    FULL_STREAM_LAYERS,
    TRANSFORMERS_BASE,
    capture_sites,
    class_constants,
    default_ids,
    eagle3_archs,
    ids_reaching_decoder,
    refusal_line,
    registry,
    supports_eagle3,
    transformers_backend_layers,
    vllm_capture,
    vllm_package,
)

pytestmark = pytest.mark.integration  # vLLM's and SGLang's own code, from their wheels

N = 12  # stub depth; SPLIT is where a two-stage pipeline cuts it
SPLIT = 5
M = "vllm/model_executor/models/"

# Capture loops a stub cannot run, and why; a new loop that fails appears as a failure, and one
# listed here that starts running fails test_unrunnable_list_is_exact.
UNRUNNABLE = {
    "vllm/models/deepseek_v4/nvidia/model.py:DeepseekV4Model": "hyper-connection streams (hc_mult parallel residuals) "
                                                                "unpack into 4, not a (hidden, residual) pair",
    "vllm/models/glm5next/common/model.py:Glm5NextModel": "layers return 4 values (hyper-connection state)",
    "vllm/models/kimi_k3/nvidia/model.py:KimiLinearModel": "layers return 3 values (attention-residual state)",
    M + "plamo3.py:Plamo3Decoder": "the loop lives in a decoder module called with hidden_states, not input_ids",
}
# Engine-side failures that are the engine's behaviour, not the stub's: id 0 with residual None.
EMBED_DIES = {M + "deepseek_v2.py:DeepseekV2Model"}  # `hidden_states + residual` while residual is None
# Single-stage rule differences from points.py: site -> {id list: what vLLM captures}.
SINGLE_STAGE_DIFFERENCES = {
    "vllm/models/deepseek_v32/nvidia/model.py:DeepseekV32Model": {(12,): [], (2, 6, 12): [layer_out(1), layer_out(5)]},
}


def key(ci) -> str:
    return f"{ci.module}:{ci.name}"


@pytest.fixture(scope="module")
def vllm():
    pk = vllm_package(PINNED["vllm"])
    archs = eagle3_archs(pk)
    yes = {a: c for a, c in archs.items() if c is not None and supports_eagle3(pk, c)}
    return pk, archs, yes, capture_sites(pk, list(yes.values()))


def _points(aux: list) -> list:
    out = []
    for a in aux:
        assert isinstance(a, Stream) and a.part == "", f"captured something other than a whole stream: {a!r}"
        out.append(EMBED if a.index == 0 else layer_out(a.index - 1))
    return out


def _lists(seed: int, n: int = 30) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    lists = [(2, 6, 9), (0, 6, 12), (9, 2, 6), (3, 3, 7), (12,), (1, 2, 3, 4), (SPLIT,), (SPLIT, SPLIT + 1), (1, 11)]
    return lists + [tuple(rng.sample(range(0, N + 1), rng.choice([1, 3, 4]))) for _ in range(n)]


# --- 1. which classes can capture at all -------------------------------------------------


def test_vllm_support_set_is_what_the_wheel_declares(vllm):
    pk, archs, yes, _ = vllm
    assert frozenset(yes) == VLLM_EAGLE3_ARCHS, sorted(frozenset(yes) ^ VLLM_EAGLE3_ARCHS)
    assert frozenset(archs) - frozenset(yes) == VLLM_NO_EAGLE3_ARCHS
    assert None not in archs.values()  # every registered class was found in the source
    assert refusal_line(pk) == VLLM_REFUSAL


def test_vllm_cpu_build_differs_only_by_the_deepseek_v4_vl_stub():
    pk = vllm_package(PINNED["vllm"], platform="cpu")
    yes = {a for a, c in eagle3_archs(pk).items() if c is not None and supports_eagle3(pk, c)}
    assert VLLM_EAGLE3_ARCHS - yes == {"DeepseekV4ForConditionalGeneration"} and not yes - VLLM_EAGLE3_ARCHS


def test_sglang_support_set_is_what_the_wheel_declares():
    pk = Package.parse(sources(wheel("sglang", PINNED["sglang"]), "sglang/srt/models/"), "sglang.srt.models")
    found = [c for c in (pk.lookup(m, n) for m, n in pk.entries) if c is not None]
    yes = {c.name for c in found if pk.resolve(c, SET_LAYERS) is not None}
    assert yes == SGLANG_EAGLE3_ARCHS, sorted(yes ^ SGLANG_EAGLE3_ARCHS)
    assert {c.name for c in found} - yes == SGLANG_NO_EAGLE3_ARCHS


# --- 2. the capture loops ------------------------------------------------------------------


def test_every_capture_loop_is_listed(vllm):
    *_, sites = vllm
    assert len(sites) == 30, [key(c) for c in sites]
    keys = {key(c) for c in sites}
    assert set(UNRUNNABLE) | EMBED_DIES | set(SINGLE_STAGE_DIFFERENCES) <= keys
    for path, line in FULL_STREAM_LAYERS.items():
        assert line in vllm[0].src[path], path


def test_unrunnable_list_is_exact(vllm):
    pk, *_, sites = vllm
    failing = set()
    for ci in sites:
        try:
            vllm_capture(pk, ci, (2, 6, 9), N)
        except (TypeError, ValueError, AttributeError, AssertionError):
            failing.add(key(ci))
    assert failing == set(UNRUNNABLE), sorted(failing ^ set(UNRUNNABLE))


def test_single_stage_capture_matches_points(vllm):
    """One stage: every runnable loop captures exactly points.fed_points, slot by slot."""
    pk, *_, sites = vllm
    checked = 0
    for ci in sites:
        k = key(ci)
        if k in UNRUNNABLE:
            continue
        for ids in _lists(1):
            expected = fed_points(list(ids), Engine("vllm", PINNED["vllm"]), N)
            if k in EMBED_DIES and 0 in ids:
                with pytest.raises(TypeError):  # the server dies at startup, as VLLM_NO_EMBED_MODEL_TYPES says
                    vllm_capture(pk, ci, ids, N)
                continue
            got = _points(vllm_capture(pk, ci, ids, N))
            if k in SINGLE_STAGE_DIFFERENCES and N in ids:
                continue  # pinned by test_single_stage_differences
            assert got == expected, (k, ids, got, expected)
            checked += 1
    assert checked > 600


def test_single_stage_differences(vllm):
    """vLLM 0.32.0's CUDA DeepseekV32Model (DeepSeek-V3.2, GLM-5) never captures id L, the last layer's
    pre-norm output, which points.py's vLLM rule (and the CPU build's DeepseekV2Model) captures."""
    pk, *_, sites = vllm
    by_key = {key(c): c for c in sites}
    for k, cases in SINGLE_STAGE_DIFFERENCES.items():
        for ids, got in cases.items():
            assert _points(vllm_capture(pk, by_key[k], ids, N)) == got, (k, ids)
            assert got != fed_points(list(ids), Engine("vllm", PINNED["vllm"]), N)


# --- pipeline parallel: two stages split at SPLIT -------------------------------------------
#
# What a drafter is fed is the last stage's aux list. Loops that relay the first stage's captures
# (`collect_remote_aux_hidden_states`) feed points.fed_points. The others drop them: vLLM's V2 runner
# (the default with Triton) refuses EAGLE-3 over PP unless the decoder sets
# `supports_aux_hidden_states_over_pp` ("... does not support eagle3 with pipeline parallelism"), the V1
# runner (CPU, VLLM_USE_V2_MODEL_RUNNER=0) serves them as below. Each rule: HF indices captured.


def _hf(ids, keep) -> list:
    return [EMBED if v == 0 else layer_out(v - 1) for v in sorted({v for i in ids for v in keep(i)})]


def _absolute(ids):  # the last stage's ids, in vLLM's meaning; the first stage's are lost
    return _hf(ids, lambda i: [i] if SPLIT <= i <= N else [])


def _absolute_no_last(ids):  # ... and id L is never captured (DeepseekV32Model on CUDA)
    return _hf(ids, lambda i: [i] if SPLIT <= i < N else [])


def _stage_local(ids):  # numbered inside the last stage: id i = output of its (i-1)-th layer, 0 = its input
    return _hf(ids, lambda i: [SPLIT + i] if SPLIT + i <= N else [])


def _mixed(ids):  # entry captured by absolute id (start_layer) AND the loop by local position (mimo_v2.py)
    return _hf(ids, lambda i: [SPLIT] * (i == SPLIT) + [SPLIT + i] * (1 <= i <= N - SPLIT))


def _after_start_and_zero(ids):  # absolute after the stage's first layer; id 0 = the stage's input (qwen3_vl.py)
    return _hf(ids, lambda i: [SPLIT] if i == 0 else [i] if SPLIT < i <= N else [])


PP_RELAYED = {M + "llama.py:LlamaModel", M + "qwen2.py:Qwen2Model", M + "sarvam.py:SarvamMLAModel",
              "vllm/models/minimax_m3/nvidia/model.py:MiniMaxM3Model"}
PP_RULES = {
    **{M + f: _absolute for f in ("cohere2_moe.py:Cohere2MoeModel", "deepseek_v2.py:DeepseekV2Model",
                                  "gpt_oss.py:GptOssModel", "k2_horizon.py:K2HorizonModel", "laguna.py:LagunaModel",
                                  "muse_glimmer.py:MuseGlimmerModel", "qwen3_moe.py:Qwen3MoeModel",
                                  "qwen3_omni_moe_thinker.py:Qwen3MoeLLMModel", "qwen3_vl_moe.py:Qwen3MoeLLMModel")},
    **{M + f: _stage_local for f in ("afmoe.py:AfmoeModel", "apertus.py:ApertusModel", "gemma4.py:Gemma4Model",
                                     "granite.py:GraniteModel", "minicpm.py:MiniCPMModel",
                                     "minimax_m2.py:MiniMaxM2Model", "nemotron_h.py:NemotronHModel",
                                     "step1.py:StepDecoderModel")},
    M + "mimo_v2.py:MiMoV2Model": _mixed,
    M + "qwen3_vl.py:Qwen3LLMModel": _after_start_and_zero,  # claims supports_aux_hidden_states_over_pp (Qwen2Model's)
    M + "qwen3_next.py:Qwen3NextModel": _after_start_and_zero,
    M + "interns2_mobius.py:InternS2MobiusModel": _after_start_and_zero,
    "vllm/models/deepseek_v32/nvidia/model.py:DeepseekV32Model": _absolute_no_last,
}
SITES = sorted(PP_RELAYED | set(PP_RULES))


def _site(vllm, k):
    return next(c for c in vllm[3] if key(c) == k)


def test_pp_tables_cover_every_runnable_loop(vllm):
    runnable = {key(c) for c in vllm[3]} - set(UNRUNNABLE)
    assert runnable == set(SITES), sorted(runnable ^ set(SITES))
    pk = vllm[0]
    flagged = {k for k in SITES if class_constants(pk, _site(vllm, k)).get("supports_aux_hidden_states_over_pp")}
    assert flagged == PP_RELAYED | {M + "qwen3_vl.py:Qwen3LLMModel"}


def _pp_cases(vllm, k):
    pk = vllm[0]
    for ids in _lists(2, 20):
        if k in EMBED_DIES and 0 in ids:
            continue
        yield ids, _points(vllm_capture(pk, _site(vllm, k), ids, N, split=SPLIT))


STAGES = Stages(((0, SPLIT), (SPLIT, N)))


@pytest.mark.parametrize("k", SITES)
def test_pp_capture_matches_points(vllm, k):
    """Two stages: every serving class of this loop is fed exactly points.fed_points over those stages."""
    archs = sorted(a for a, d in SERVED_BY.items() if d == k)
    assert archs, f"no serving class of {k} in vllm_pp.SERVED_BY"
    for ids, got in _pp_cases(vllm, k):
        for arch in archs:
            expected = fed_points(list(ids), Engine("vllm", PINNED["vllm"], arch), N, pp=STAGES)
            assert got == [p for p in expected if p is not None], (k, arch, ids, got, expected)
            assert expected.count(None) == sum(not PP_RULES.get(k, _relayed)([i]) for i in ids), (arch, ids)


def _relayed(ids):
    return _hf(ids, lambda i: [i])


def test_pp_rule_table_is_the_one_executed():
    """vllm_pp's rule names are this file's formulas, loop by loop (the formulas are the independent truth)."""
    assert DECODER_RULES == {**dict.fromkeys(PP_RELAYED, "relayed"),
                             **{k: f.__name__.strip("_") for k, f in PP_RULES.items()}}


def _built_sites(pk, ci, sites: set[str], reg: dict, depth: int = 0) -> set[str]:
    """The capture loops a serving class reaches statically: its own bases', else those of the classes its
    __init__s call and of the registered architectures they name (`architectures=["DeepseekV2ForCausalLM"]`)."""
    own = [key(a) for a in pk.ancestors(ci) if key(a) in sites]  # the most derived loop runs
    if own or depth > 3:
        return set(own[:1])
    found: set[str] = set()
    for owner, node in ((a, n) for a in pk.ancestors(ci) if "__init__" in a.methods
                        for n in ast.walk(a.methods["__init__"]) if isinstance(n, ast.Call)):
        sub = pk.lookup(owner.module, node.func.id) if isinstance(node.func, ast.Name) else None
        named = [e.value for kw in node.keywords if kw.arg == "architectures" and isinstance(kw.value, ast.List)
                 for e in kw.value.elts if isinstance(e, ast.Constant) and e.value in reg]
        for c in [sub] * (sub not in (None, ci)) + [pk.lookup(*reg[a]) for a in named]:
            found |= _built_sites(pk, c, sites, reg, depth + 1)
    return found


# MiMoModel (mimo.py) subclasses Qwen2Model but overrides its forward with one that reads no ids.
NOT_ITS_LOOP = {"MiMoForCausalLM"}


def test_served_by_agrees_with_the_model_files(vllm):
    """Each serving class's loop in vllm_pp.SERVED_BY is one its model file reaches, and every class the scan
    pins to one runnable loop is encoded (the rest are refused under PP, never guessed)."""
    pk, _, yes, sites = vllm
    reg, keys = registry(pk), {key(c) for c in sites} - set(UNRUNNABLE)
    reached = {arch: _built_sites(pk, ci, keys, reg) for arch, ci in yes.items()}
    for arch, site in SERVED_BY.items():
        assert arch in yes and arch not in TRANSFORMERS_BACKEND_ARCHS, arch
        assert not reached[arch] or site in reached[arch], (arch, site, reached[arch])
    pinned = {a for a, r in reached.items() if len(r) == 1} - NOT_ITS_LOOP
    assert pinned - set(SERVED_BY) == set(), sorted(pinned - set(SERVED_BY))
    assert sum(bool(r) for r in reached.values()) > 40  # the scan reaches most classes' loops


@pytest.mark.parametrize("k", sorted(PP_RULES))
def test_pp_difference_is_exactly(vllm, k):
    """What the last stage feeds, per id list, against this file's formula for the loop."""
    for ids, got in _pp_cases(vllm, k):
        assert got == PP_RULES[k](ids), (k, ids, got)


# --- the Transformers backend (Olmo2, SmolLM3, Starcoder2, ... 22 registered targets) ---------------
# It has no capture loop of its own: `set_aux_hidden_state_layers` registers transformers OutputRecorders
# on `_layer_names[layer - 1]` ("layer - 1 because we want the input to the layer"), a dict keyed 0..L-1:
# id 0 raises KeyError at startup. Executed here; the order transformers hands the recorded outputs back
# in (that of `_can_record_outputs`, the order the ids are written in) is assumed.


def test_transformers_backend_matches_points(vllm):
    for ids in _lists(3):
        for arch in ("Olmo2ForCausalLM", "SmolLM3ForCausalLM"):
            expected = fed_points(list(ids), Engine("vllm", PINNED["vllm"], arch), N)
            if 0 in ids:
                with pytest.raises(KeyError):  # the server dies at startup; points.py: id 0 feeds nothing
                    transformers_backend_layers(vllm[0], ids, N)
                assert expected.count(None) == 1, ids
                continue
            got = [layer_out(k) for k in transformers_backend_layers(vllm[0], ids, N)]
            assert got == expected, (ids, got, expected)


def test_transformers_backend_difference_is_exactly(vllm):
    """Independent of points.py: layer i-1's output per distinct id, in the order written (not ascending)."""
    for ids in _lists(3):
        if 0 not in ids:
            written = list(dict.fromkeys(ids))  # deduplicated, first occurrence kept, order as written
            assert transformers_backend_layers(vllm[0], ids, N) == [i - 1 for i in written], ids
    assert transformers_backend_layers(vllm[0], (9, 2, 6), N) != sorted(transformers_backend_layers(vllm[0], (9, 2, 6), N))


def test_transformers_backend_targets_are_the_22(vllm):
    pk, _, yes, _ = vllm
    derived = {a for a, ci in yes.items() if pk.resolve(ci, "set_aux_hidden_state_layers").module == TRANSFORMERS_BASE}
    assert derived == TRANSFORMERS_BACKEND_ARCHS and len(derived) == 22


# --- every EAGLE-3 class's own set path ------------------------------------------------------------


def test_every_eagle3_class_hands_its_ids_to_the_decoder_unchanged(vllm):
    """`set_aux_hidden_state_layers` as each class resolves it (interfaces' default, or deepseek_v2.py,
    qwen3_5.py, kimi_k25.py, pixtral.py, mllama4.py delegating): the decoder's loop sees the ids as given."""
    pk, _, yes, _ = vllm
    checked = 0
    for arch, ci in sorted(yes.items()):
        if pk.resolve(ci, "set_aux_hidden_state_layers").module == TRANSFORMERS_BASE:
            continue  # the Transformers backend records by layer name: tested above
        for ids in ((9, 2, 6, 6), (0, 12), (1,)):
            assert set(ids_reaching_decoder(pk, ci, ids)) == set(ids), (arch, ids)
        checked += 1
    assert checked == len(yes) - 22  # the 22 Transformers-backend targets


# --- 3. default ids --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [N, 61])
def test_default_ids_of_every_eagle3_class(vllm, n):
    pk, _, yes, _ = vllm
    for arch, ci in sorted(yes.items()):
        ids = default_ids(pk, ci, n)
        assert points_from_ids(list(ids), "vllm", n) == default_points(Engine("vllm", PINNED["vllm"], arch), n), arch
