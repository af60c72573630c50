"""DFlash ids against a table written from docs/parallel-drafters.md §2 (not from the code under test)."""

from __future__ import annotations

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.dflash_ids import (
    check_dflash_points,
    dflash_ids_for_points,
    dflash_problems,
    points_from_dflash_ids,
    vllm_reads_dflash,
)
from eaglewire.targets.points import EMBED, FINAL_NORM, Point, layer_out

pytestmark = pytest.mark.unit
L = 30  # the default target

# (point, z-lab id, vLLM/speculators id, llama.cpp id) for L = 30, by hand from §2's table
TABLE = [
    ("layers.0.out", 0, 1, 1),
    ("layers.1.out", 1, 2, 2),
    ("layers.14.out", 14, 15, 15),
    ("layers.28.out", 28, 29, 29),
    ("layers.29.out", 29, 30, None),  # the last layer's output: vLLM only (id L); llama.cpp cannot
    ("embed", None, None, None),
    ("final_norm", None, None, None),
]


@pytest.mark.parametrize("name,zlab,vllm,llama", TABLE)
def test_ids_for_each_point_match_the_table(name, zlab, vllm, llama):
    p = [Point.parse(name)]
    assert dflash_ids_for_points(p, "zlab", L) == [zlab]
    assert dflash_ids_for_points(p, "sglang", L) == [zlab]  # alias
    assert dflash_ids_for_points(p, "vllm", L) == [vllm]
    assert dflash_ids_for_points(p, "speculators", L) == [vllm]  # alias
    assert dflash_ids_for_points(p, "llama.cpp", L) == [llama]


@pytest.mark.parametrize("conv", ["zlab", "dflash", "vllm", "speculators", "llama.cpp"])
def test_round_trip_every_convention(conv):
    for k in range(L):
        (i,) = dflash_ids_for_points([layer_out(k)], conv, L)
        if i is None:
            continue
        assert points_from_dflash_ids([i], conv, L) == [layer_out(k)]


def test_the_default_drafter_reads_the_same_points_in_both_numberings():
    pts = [layer_out(1), layer_out(14), layer_out(28)]
    assert points_from_dflash_ids([1, 14, 28], "zlab", L) == pts
    assert points_from_dflash_ids([2, 15, 29], "vllm", L) == pts
    # the classic miswiring: z-lab ids written where vLLM numbering is read -> one layer shallower everywhere
    assert points_from_dflash_ids([1, 14, 28], "vllm", L) == [layer_out(0), layer_out(13), layer_out(27)]


@pytest.mark.parametrize("conv,ids,needle", [
    ("zlab", [-1], "embed"),
    ("zlab", [30], "30 layers"),
    ("vllm", [0], "embed"),
    ("vllm", [31], "30 layers"),
    ("llama.cpp", [30], "layers.29.out"),
    ("zlab", [True], "integer"),
])
def test_bad_ids_refused_in_one_line_naming_the_id(conv, ids, needle):
    with pytest.raises(EaglewireError) as e:
        points_from_dflash_ids(ids, conv, L)
    msg = str(e.value)
    assert "\n" not in msg and str(ids[0]) in msg and needle in msg


@pytest.mark.parametrize("eng,point,ok", [
    ("vllm", "layers.29.out", True), ("sglang", "layers.29.out", False), ("llama.cpp", "layers.29.out", False),
    ("sglang", "layers.28.out", True), ("llama.cpp", "layers.28.out", True),
    ("vllm", "embed", False), ("sglang", "embed", False), ("llama.cpp", "embed", False),
    ("vllm", "final_norm", False), ("sglang", "final_norm", False), ("llama.cpp", "final_norm", False),
])
def test_engine_reach(eng, point, ok):
    p = Point.parse(point)
    assert (dflash_problems([p], eng, L) == []) is ok
    if not ok:
        with pytest.raises(EaglewireError) as e:
            check_dflash_points([p], eng, L)
        assert "\n" not in str(e.value) and point in str(e.value) and eng in str(e.value)


def test_unsorted_and_repeated_points_are_refused_for_every_engine():
    for eng in ("vllm", "sglang", "llama.cpp"):
        assert dflash_problems([layer_out(14), layer_out(1)], eng, L)
        assert dflash_problems([layer_out(1), layer_out(1)], eng, L)
        assert not dflash_problems([layer_out(1), layer_out(14)], eng, L)


def test_unknown_convention_named():
    with pytest.raises(EaglewireError, match="hf"):
        dflash_ids_for_points([EMBED], "hf", L)
    assert dflash_ids_for_points([FINAL_NORM, EMBED], "vllm", L) == [None, None]


# (config.json, L, vLLM ids, key) from §2's "vLLM 0.32.0 pitfalls", executed there on the wheel
VLLM_CASES = [
    ({"dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}}, 36, [2, 10, 18, 26, 34], "dflash_config"),
    ({"target_layer_ids": [1, 14, 27]}, 30, [2, 15, 27], "none read"),
    ({"dflash_config": {"target_layer_ids": [1, 14, 28]}, "eagle_config": {"x": 1}}, 30, [2, 15, 27], "none read"),
    ({"dflash_config": {"target_layer_ids": [1, 14, 28]}, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3]}},
     30, [3], "eagle_config"),
    ({"eagle_aux_hidden_state_layer_ids": [2, 15, 29], "dflash_config": {"target_layer_ids": [5]}}, 30, [2, 15, 29],
     "eagle_aux_hidden_state_layer_ids"),
    ({"speculators_model_type": "dflash", "aux_hidden_state_layer_ids": [2, 15, 29]}, 30, [2, 15, 29],
     "eagle_aux_hidden_state_layer_ids"),
]


@pytest.mark.parametrize("cfg,n,ids,key", VLLM_CASES)
def test_what_vllm_reads(cfg, n, ids, key):
    got_ids, got_key, pts = vllm_reads_dflash(cfg, n)
    assert got_ids == ids and got_key.startswith(key)
    assert pts == [EMBED if i == 0 else layer_out(i - 1) for i in ids]
