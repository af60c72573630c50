"""Our id rules (`eaglewire.targets.points`) against the engines' own code, executed at pinned versions.

The engines' methods are compiled from the wheels' source files and run on stub
models (src/eaglewire_testing/engine_code.py says how and why). For SGLang two steps
decide what a drafter is fed:

1. `set_eagle3_layers_to_capture(ids)` on the target class (all 29 model files
   that define it, and every registered class that inherits or wraps one)
   turns the ids into `layers_to_capture`;
2. the model's forward hands a capture hook to layer v for each v in it, so v
   captures the stream entering layer v (HF index v), in layer order.

For vLLM: `_set_aux_hidden_state_layers` (sorted, deduplicated) and the capture
in `LlamaModel.forward` (`_maybe_add_hidden_state(idx + 1, hidden + residual)`),
and which config key the runner reads the ids from.

A changed rule in a newer release makes these tests fail: bump `PINNED` in
eaglewire/targets/points.py and they run against that release.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import (
    EMBED,
    PINNED,
    SGLANG_FIRST_ID_ARCHS,
    SGLANG_FIRST_ID_RULE_SINCE,
    SGLANG_LAST_ALWAYS_PLUS_ONE,
    Engine,
    default_points,
    eagle3_default,
    fed_points,
    ids_for_points,
    layer_out,
    points_from_ids,
)
from eaglewire_testing.engine_code import (
    BUILT_INDIRECTLY,
    SET_LAYERS,
    Outside,
    Package,
    Stream,
    StubLayer,
    compile_function,
    run_capture,
    sglang_layers_to_capture,
    sources,
    wheel,
)

pytestmark = pytest.mark.integration  # SGLang's and vLLM's own code, from their wheels

L = 61  # Kimi-K2.5 / DeepSeek-V3 depth
# Model classes whose forward runs on stub layers here (the rest route the hook through
# runtime objects a stub cannot stand in for); they cover every family in PINNED's rules.
CAPTURE_SITES = ["LlamaModel", "Qwen2Model", "Qwen3Model", "Qwen3LLMModel", "Qwen3MoeLLMModel", "DeepseekV2Model",
                 "Glm4MoeLiteModel", "Glm4MoeModel", "Glm4Model", "Llama4Model", "ExaoneMoEModel", "ApertusModel",
                 "GptOssModel", "Gemma4TextModel", "LagunaModel", "NanbeigeModel", "GraniteMoeHybridModel"]


@pytest.fixture(scope="module")
def sglang():
    return Package.parse(sources(wheel("sglang", PINNED["sglang"]), "sglang/srt/models/"), "sglang.srt.models")


def _id_lists(rng: random.Random, n: int = 40) -> list[list[int]]:
    lists = [[2, 30, 58], [1, 30, 58], [1, 2, 3], [0, 1, 2], [0, 30, 59], [3, 31, 59], [1, 30, 60], [59, 30, 2]]
    for _ in range(n):
        k = rng.choice([1, 2, 3, 4])
        ids = sorted(rng.sample(range(0, L), k))
        if rng.random() < 0.3:
            ids[0] = 1 if 1 not in ids[1:] else ids[0]
        lists.append(ids)
    return lists


def _engine_points(values: list[int], n: int = L, end: bool = False) -> list:
    """What a layers_to_capture list captures, by the capture-site rule the forward test proves; with `end`
    (a forward that captures at end_layer, gpt_oss.py from 0.5.21) the value n is the last layer's output."""
    top = n if end else n - 1
    return [EMBED if v == 0 else layer_out(v - 1) if 1 <= v <= top else None for v in values]


def _entry_classes(pk: Package):
    for mod, name in pk.entries:
        ci = pk.lookup(mod, name)
        if ci is not None and pk.resolve(ci, SET_LAYERS) is not None:
            yield ci


def test_every_sglang_model_file_is_covered(sglang):
    defining = {ci.module for ci in sglang.classes.values() if SET_LAYERS in ci.methods}
    assert len(defining) == 29, sorted(defining)  # the count the issue and the docs state for 0.5.23
    reached = {sglang.resolve(ci, SET_LAYERS).module for ci in _entry_classes(sglang)}
    assert defining - reached <= {"sglang/srt/models/qwen3_5.py"}  # reached through qwen3_5_text.py's body_cls
    for (mod, name), subs in BUILT_INDIRECTLY.items():  # the wiring the static scan cannot see is in the source
        for _attr, (_m, _c, line) in subs.items():
            assert line in sglang.src[mod], (mod, name, line)


def test_sglang_rules_match_executed_code(sglang):
    """Every registered target class, many id lists: engine code and points.py name the same points."""
    rng = random.Random(0)
    lists = _id_lists(rng)
    first_id, checked, outside = set(), 0, []
    for ci in _entry_classes(sglang):
        try:
            sglang_layers_to_capture(sglang, ci, [2, 30, 58], L)
        except Outside:
            outside.append(ci.name)
            continue
        eng = Engine("sglang", PINNED["sglang"], ci.name)
        for ids in lists:
            try:
                values, _ = sglang_layers_to_capture(sglang, ci, ids, L)
            except IndexError:  # the engine itself fails on an id past its last layer
                with pytest.raises(EaglewireError):
                    points_from_ids(ids, eng, L)
                continue
            if values != [v + 1 for v in ids]:
                first_id.add(ci.name)
            got = _engine_points(values, L, "end_layer in self.layers_to_capture" in sglang.src.get(
                sglang.resolve(ci, SET_LAYERS).module, "") and ci.name == "GptOssForCausalLM")
            try:
                ours = points_from_ids(ids, eng, L)
            except EaglewireError:
                # refused by us: the engine captures nothing there, or the embedding through
                # layer 0's hook, which we do not offer (see docs/conventions.md)
                assert None in got or EMBED in got, (ci.name, ids, values)
                continue
            assert ours == got, (ci.name, ids, values, ours)
            assert fed_points(ids, eng, L) == sorted(set(got)) + [], (ci.name, ids)
            checked += 1
        default, _ = sglang_layers_to_capture(sglang, ci, None, L)
        assert _engine_points(default) == default_points(eng, L), ci.name
    assert outside == ["MindSporeForCausalLM"]  # hands the ids to sgl_mindspore, outside SGLang
    assert first_id == set(SGLANG_FIRST_ID_ARCHS), sorted(first_id ^ set(SGLANG_FIRST_ID_ARCHS))
    assert checked > 2000


@pytest.mark.parametrize("model", CAPTURE_SITES)
def test_sglang_capture_site_is_the_stream_entering_layer_v(sglang, model):
    """layers_to_capture value v hooks layer v's entry: HF boundary v, in layer order, once each."""
    ci = next(c for c in sglang.classes.values() if c.name == model and "layers_to_capture" in
              sglang.src[c.module] and "forward" in c.methods or c.name == model and c.bases[0].endswith("Model"))
    n = 8
    for values in ([2, 4, 5], [1, 3, 6], [6, 1, 3], [3, 3, 5], [0, 2, 7]):
        got = [s for s in run_capture(sglang, ci, values, n) if isinstance(s, Stream)]
        within = sorted({v for v in values if v < n})
        assert [s.index for s in got if s.index < n] == within, (model, values, got)


def test_seeds_kimi_case_is_read_one_layer_early_by_0_5_23(sglang):
    """[2, 30, 58] written for classic SGLang, served by 0.5.23 on Kimi-K2.5: one layer early."""
    (kimi,) = [ci for ci in _entry_classes(sglang) if ci.name == "KimiK25ForConditionalGeneration"]
    values, holder = sglang_layers_to_capture(sglang, kimi, [2, 30, 58], L)
    assert holder.name == "DeepseekV2Model"
    got = _engine_points(values)
    assert [p.name for p in got] == ["layers.1.out", "layers.29.out", "layers.57.out"]
    trained = points_from_ids([2, 30, 58], "sglang==0.5.12", L, "KimiK25ForConditionalGeneration")
    fix = ids_for_points(trained, Engine("sglang", "0.5.23", "KimiK25ForConditionalGeneration"), L)
    assert fix == [3, 31, 59]
    assert _engine_points(sglang_layers_to_capture(sglang, kimi, fix, L)[0]) == trained


def test_sglang_before_the_condition_always_adds_one():
    """0.5.12.post1, the last release before SGLANG_FIRST_ID_RULE_SINCE: deepseek_v2 adds +1 always."""
    pk = Package.parse(sources(wheel("sglang", SGLANG_LAST_ALWAYS_PLUS_ONE), "sglang/srt/models/deepseek_v2.py"),
                       "sglang.srt.models")
    (ci,) = [c for c in pk.classes.values() if c.name == "DeepseekV2ForCausalLM"]
    for ids in ([2, 30, 58], [1, 30, 58], [0, 5]):
        values, _ = sglang_layers_to_capture(pk, ci, ids, L)
        assert values == [v + 1 for v in ids]
        assert _engine_points(values) == points_from_ids(ids, "sglang==0.5.12.post1", L, ci.name)
    assert Engine("sglang", "0.5.12.post1", ci.name).rule == "sglang"
    assert Engine("sglang", SGLANG_FIRST_ID_RULE_SINCE, ci.name).rule == "sglang-first-id"


# --- vLLM ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm():
    src = sources(wheel("vllm", PINNED["vllm"]), "vllm/")
    keep = {k: v for k, v in src.items() if k in (
        "vllm/model_executor/models/interfaces.py", "vllm/model_executor/models/llama.py",
        "vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py")}
    return Package.parse(keep, "vllm")


def _fake_import(name, *a, **k):
    if name.startswith("vllm"):
        return SimpleNamespace(model_parallel_is_initialized=lambda: False, get_pp_group=lambda: None)
    return __import__(name, *a, **k)


def _vllm_capture(pk: Package, ids: tuple[int, ...], n: int) -> list[Stream]:
    mixin = pk.classes[("vllm/model_executor/models/interfaces.py", "EagleModelMixin")]
    model = pk.classes[("vllm/model_executor/models/llama.py", "LlamaModel")]
    pp = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)
    env = {"get_pp_group": lambda: pp, "__builtins__": {**__builtins__, "__import__": _fake_import}
           if isinstance(__builtins__, dict) else {**vars(__builtins__), "__import__": _fake_import}}
    s = SimpleNamespace(layers=[StubLayer(k) for k in range(n)], start_layer=0, end_layer=n,
                        embed_input_ids=lambda *a: Stream(0), norm=lambda h, r: (h, r))
    for name in ("_set_aux_hidden_state_layers", "_cache_aux_pp_layout", "_maybe_add_hidden_state",
                 "collect_remote_aux_hidden_states", "pack_local_aux_hidden_states"):
        fn = compile_function(pk.src[mixin.module], mixin.module, mixin.methods[name], env)
        setattr(s, name, (lambda f: lambda *a, **k: f(s, *a, **k))(fn))
    s._aux_upstream_total_cached = 0
    s._set_aux_hidden_state_layers(ids)
    fwd = compile_function(pk.src[model.module], model.module, model.methods["forward"], env)
    _, aux = fwd(s, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None)
    return aux


def test_vllm_rules_match_executed_code(vllm):
    n = 12
    rng = random.Random(1)
    lists = [(2, 6, 9), (0, 6, 12), (9, 2, 6), (3, 3, 7), (12,), (1, 2, 3, 4)]
    lists += [tuple(rng.sample(range(0, n + 1), rng.choice([1, 3, 4]))) for _ in range(30)]
    for ids in lists:
        aux = _vllm_capture(vllm, ids, n)
        assert all(isinstance(a, Stream) and a.part == "" for a in aux), aux
        got = [EMBED if a.index == 0 else layer_out(a.index - 1) for a in aux]
        assert got == fed_points(list(ids), Engine("vllm", PINNED["vllm"]), n), ids
        assert sorted(set(points_from_ids(list(ids), "vllm", n))) == got


def test_vllm_reads_top_level_ids_then_nested(vllm):
    """The v1 runner (used on CPU) falls back to eagle_config; the new GPU runner reads only the top level."""
    runner = vllm.classes[("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner")]
    fn = vllm.function(runner, "_get_eagle3_aux_layers_from_config")
    utils = vllm.src["vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"]
    import ast

    node = next(f for f in ast.parse(utils).body if isinstance(f, ast.FunctionDef)
                and f.name == "get_eagle3_aux_layers_from_config")
    fn2 = compile_function(utils, "eagle3_utils.py", node)

    def spec(**cfg):
        hf = SimpleNamespace(**cfg)
        return SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))

    top = spec(eagle_aux_hidden_state_layer_ids=[2, 15, 27], eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    nested = spec(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 15, 27]})
    assert fn(SimpleNamespace(speculative_config=top)) == (2, 15, 27)
    assert fn(SimpleNamespace(speculative_config=nested)) == (2, 15, 27)
    assert fn2(top) == (2, 15, 27)
    assert not fn2(nested)  # ignored: the model's default applies
    assert ids_for_points(eagle3_default(30), "vllm==0.32.0", 30) == [2, 15, 27]


def test_sglang_gpt_oss_keeps_a_list_that_reaches_the_last_layer(sglang):
    """gpt_oss.py (0.5.17+): a list whose largest id is L is kept as written, L captured after the last layer;
    any other list takes the +1. Executed at the pinned release and the last release before the condition."""
    from eaglewire.targets.points import SGLANG_END_CAPTURE_SINCE, SGLANG_LAST_ID_RULE_SINCE

    (ci,) = [c for c in _entry_classes(sglang) if c.name == "GptOssForCausalLM"]
    n = 36  # GPT-OSS-120B's depth
    eng = Engine("sglang", PINNED["sglang"], ci.name)
    assert "end_layer in self.layers_to_capture" in sglang.src[ci.module]  # the end-of-stack capture site
    for ids in ([2, 18, 36], [1, 17, 35], [2, 18, 33], [35, 36]):
        values, _ = sglang_layers_to_capture(sglang, ci, ids, n)
        ours = points_from_ids(ids, eng, n)
        assert ours == _engine_points(values, n, end=True), (ids, values)
        assert points_from_ids(ids_for_points(ours, eng, n), eng, n) == ours
    for version, rule, end in (("0.5.16", "sglang", False), (SGLANG_LAST_ID_RULE_SINCE, "sglang-last-id", False),
                               ("0.5.20", "sglang-last-id", False), (SGLANG_END_CAPTURE_SINCE, "sglang-last-id-end", True)):
        pk = Package.parse(sources(wheel("sglang", version), "sglang/srt/models/gpt_oss.py"), "sglang.srt.models")
        (old,) = [c for c in pk.classes.values() if c.name == "GptOssForCausalLM"]
        assert ("end_layer in self.layers_to_capture" in pk.src[old.module]) == end, version
        old_eng = Engine("sglang", version, old.name)
        assert old_eng.rule == rule
        for ids in ([2, 18, 36], [2, 18, 33], [1, 17, 35]):
            values, _ = sglang_layers_to_capture(pk, old, ids, n)
            got = _engine_points(values, n, end)
            try:
                assert points_from_ids(ids, old_eng, n) == got, (version, ids, values)
            except EaglewireError:  # refused by us: the engine captures nothing for some id
                assert None in got, (version, ids, values)
