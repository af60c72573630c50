"""Engine id conversions, checked against the conventions table and the issue's worked examples."""

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import (
    EMBED,
    FINAL_NORM,
    Engine,
    Point,
    eagle3_default,
    fed_points,
    id_lists,
    ids_for_points,
    layer_out,
    order_problem,
    points_from_ids,
    version_differences,
)


def names(pts):
    return [p.name for p in pts]


def test_issue_example_l61():
    pts = points_from_ids([2, 30, 58], "sglang", 61)
    assert names(pts) == ["layers.2.out", "layers.30.out", "layers.58.out"]
    assert ids_for_points(pts, "hf", 61) == [3, 31, 59]
    assert ids_for_points(pts, "vllm", 61) == [3, 31, 59]
    v = points_from_ids([2, 30, 58], "vllm", 61)
    assert ids_for_points(v, "sglang", 61) == [1, 29, 57]


def test_defaults_agree_across_engines():
    # conventions §2: all engines' defaults land on HF [2, L//2, L-3]
    for L in (8, 30, 32, 61):
        d = eagle3_default(L)
        assert ids_for_points(d, "hf", L) == [2, L // 2, L - 3]
        assert ids_for_points(d, "vllm", L) == [2, L // 2, L - 3]
        assert ids_for_points(d, "specforge", L) == [1, L // 2 - 1, L - 4]


@pytest.mark.parametrize("L", [5, 30, 61])
def test_round_trip_every_point_every_engine(L):
    every = [EMBED] + [layer_out(k) for k in range(L)] + [FINAL_NORM]
    for eng in ("hf", "sglang", "specforge", "vllm", "speculators"):
        for p in every:
            (i,) = ids_for_points([p], eng, L)
            if i is None:
                continue
            assert points_from_ids([i], eng, L) == [p], (eng, p)


def test_unexpressible_points_are_null_not_guessed():
    L = 30
    assert ids_for_points([EMBED], "sglang", L) == [None]
    assert ids_for_points([layer_out(L - 1)], "sglang", L) == [None]
    assert ids_for_points([FINAL_NORM], "vllm", L) == [None]
    assert ids_for_points([layer_out(L - 1)], "hf", L) == [None]  # final pre-norm has no HF index
    assert ids_for_points([layer_out(L - 1)], "vllm", L) == [L]
    assert ids_for_points([FINAL_NORM], "hf", L) == [L]


def test_seed_bug_shift():
    # The seeds' wrong fix: a drafter trained on HF [3,31,59] (layers 2,30,58 out) served with
    # vLLM-meaning ids [-1,2,30] -> vLLM reads [embed?] ... here: vLLM ids [0, 3, 31] are embed + two layers
    assert names(points_from_ids([0, 3, 31], "vllm", 61)) == ["embed", "layers.2.out", "layers.30.out"]
    with pytest.raises(EaglewireError):
        points_from_ids([-1, 2, 30], "sglang", 61)


def test_out_of_range_is_an_error():
    for eng, ids in [("hf", [31]), ("vllm", [31]), ("sglang", [29]), ("sglang", [-1])]:
        with pytest.raises(EaglewireError, match="out of range"):
            points_from_ids(ids, eng, 30)
    with pytest.raises(EaglewireError, match="30 layers"):
        ids_for_points([layer_out(30)], "hf", 30)
    with pytest.raises(EaglewireError, match="engine"):
        points_from_ids([1], "tensorrt", 30)


DS = "DeepseekV3ForCausalLM"


def test_sglang_0_5_23_first_id_rule_on_deepseek_family():
    """SGLang >= 0.5.13 on DeepSeek-family targets: +1 only when the first id is 1 (executed in
    tests/export/test_engine_conformance.py); the earlier inverted model of it is gone."""
    L = 30
    new, old = Engine.parse("sglang==0.5.23", DS), Engine.parse("sglang==0.5.12", DS)
    # first id 1: the +1 applies, as in classic SGLang
    assert names(points_from_ids([1, 14, 26], new, L)) == ["layers.1.out", "layers.14.out", "layers.26.out"]
    # any other first id: read as given, one layer earlier than classic
    assert names(points_from_ids([2, 14, 26], new, L)) == ["layers.1.out", "layers.13.out", "layers.25.out"]
    assert names(points_from_ids([2, 14, 26], old, L)) == ["layers.2.out", "layers.14.out", "layers.26.out"]
    # other architectures keep the +1 in every version
    assert names(points_from_ids([2, 14, 26], "sglang==0.5.23", L, "LlamaForCausalLM")) == [
        "layers.2.out", "layers.14.out", "layers.26.out"]
    assert version_differences([1, 14, 26], "sglang", L) is None
    assert "layers.13.out" in version_differences([2, 14, 26], "sglang", L)
    # the default capture starts at layers.1.out, so its classic ids [1, 14, 26] hold everywhere
    assert ids_for_points(eagle3_default(L), new, L) == [1, 14, 26]
    assert ids_for_points([layer_out(2), layer_out(9)], new, L) == [3, 10]
    # layers.0.out first: raw id 1 would switch the +1 on, classic id 0 reads as the embedding
    assert ids_for_points([layer_out(0), layer_out(9)], new, L) == [None, None]
    for pts in ([layer_out(2), layer_out(9)], eagle3_default(L), [layer_out(1), layer_out(20)]):
        assert points_from_ids(ids_for_points(pts, new, L), new, L) == pts
    assert id_lists(eagle3_default(L), L)["sglang_deepseek"] == [1, 14, 26]


def test_engine_specs_and_assumptions():
    assert Engine.parse("sglang").assumed_version == "0.5.23"
    assert any("no sglang version" in a for a in Engine.parse("sglang").assumptions())
    assert any("newer than" in a for a in Engine.parse("vllm==9.0").assumptions())
    assert Engine.parse("sglang==0.5.23", "deepseek_v3").rule == "sglang-first-id"  # model_type works too
    with pytest.raises(EaglewireError, match="sglang==0.5.23"):
        Engine.parse("sglang-new")
    with pytest.raises(EaglewireError, match="release number"):
        Engine.parse("vllm==latest")
    with pytest.raises(EaglewireError, match="integer"):
        points_from_ids([2.5, 4, 5], "vllm", 30)


def test_engines_feed_ascending_slots():
    assert fed_points([27, 2, 15], "vllm", 30) == [layer_out(1), layer_out(14), layer_out(26)]
    assert fed_points([2, 2, 15], "vllm", 30) == [layer_out(1), layer_out(14)]
    assert order_problem([layer_out(5), layer_out(1)], "vllm") is not None
    assert order_problem([layer_out(1), layer_out(5)], "sglang") is None


def test_point_names_parse_and_order():
    assert Point.parse("layers.12.out") == layer_out(12)
    assert sorted([FINAL_NORM, layer_out(3), EMBED, layer_out(1)]) == [EMBED, layer_out(1), layer_out(3), FINAL_NORM]
    with pytest.raises(EaglewireError, match="expected"):
        Point.parse("layer3")


def test_point_option_takes_repeated_and_comma_separated_names():
    from eaglewire.targets.points import point_option

    assert [p.name for p in point_option(["layers.1.out, layers.3.out", "final_norm"], 8)] == [
        "layers.1.out", "layers.3.out", "final_norm"]
    assert point_option([], 8) == eagle3_default(8) and point_option([""], 8, default=False) == []
    with pytest.raises(EaglewireError, match="layers.9.out"):
        point_option(["layers.9.out"], 8)


def test_point_option_sets_and_layers_counted_from_the_end():
    from eaglewire.targets.points import point_option

    # the sets resolve per target: 30 layers is the default target, 8 a tiny one
    assert names(point_option(["eagle3"], 30)) == ["layers.1.out", "layers.14.out", "layers.26.out"]
    assert names(point_option(["eagle3-deep"], 30)) == ["layers.1.out", "layers.14.out", "layers.28.out"]
    assert names(point_option(["eagle3-deep"], 8)) == ["layers.1.out", "layers.3.out", "layers.6.out"]
    # the deep triple's last slot is the last layer's input: every engine names it, one id past the default's
    for eng in ("hf", "vllm", "sglang", "llama.cpp"):
        deep, base = ids_for_points(point_option(["eagle3-deep"], 30), eng, 30), ids_for_points(eagle3_default(30), eng, 30)
        assert None not in deep and deep[:2] == base[:2] and deep[2] == base[2] + 2
    assert names(point_option(["layers.-1.out,layers.-30.out", "embed"], 30)) == [
        "layers.29.out", "layers.0.out", "embed"]
    for bad in ("layers.-31.out", "layers.-0.out"):
        with pytest.raises(EaglewireError, match="layers.-1.out .. layers.-30.out"):
            point_option([bad], 30)
    with pytest.raises(EaglewireError, match="expected 'embed'"):
        point_option(["eagle4"], 30)


def test_llamacpp_ids_are_layer_inputs_in_the_order_written():
    # llama.cpp marks t_layer_inp[il] = inpL at the top of layer il (src/models/llama.cpp); executed by
    # tests/engines/test_llama_server.py, where these ids make the served acceptance equal ours
    L = 30
    d = eagle3_default(L)
    assert ids_for_points(d, "llama.cpp", L) == [2, 15, 27]  # as vLLM: id k = input of layer k
    assert ids_for_points([EMBED], "llama.cpp", L) == [0]
    assert ids_for_points([layer_out(L - 1), FINAL_NORM], "llama.cpp", L) == [None, None]  # no llama graph output
    assert names(points_from_ids([1, 14, 26], "llama.cpp", L)) == ["layers.0.out", "layers.13.out", "layers.25.out"]
    with pytest.raises(EaglewireError):
        points_from_ids([2, 15, L], "llama.cpp", L)
    # unlike vLLM, llama.cpp interleaves target_layer_ids[k] for k = 0, 1, 2: order and repeats kept
    assert fed_points([27, 2, 2], "llama.cpp", L) == [layer_out(26), layer_out(1), layer_out(1)]
    assert order_problem([layer_out(5), layer_out(1), layer_out(1)], "llama.cpp") is None
    assert id_lists(d, L)["llama.cpp"] == [2, 15, 27]
    for p in [EMBED] + [layer_out(k) for k in range(L - 1)]:
        (i,) = ids_for_points([p], "llama.cpp", L)
        assert points_from_ids([i], "llama.cpp", L) == [p]
