"""`doctor live` against SGLang (a stand-in speaking SGLang 0.5.23's routes and meta_info, no CUDA needed): a
server decoding with the drafter wired as trained passes, one whose drafter is fed the embedding in every slot
fails at a position, impossible per-request counts blame the server, and a server of no known kind gets one line
naming every route tried. The route and field names are checked against the pinned wheel (integration)."""

from __future__ import annotations

import re

import pytest

from eaglewire.doctor.live import Acceptance, doctor_live
from eaglewire.engines import sglang
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.fake_sglang import FakeSglang, rounds_of, server_info
from eaglewire_testing.fake_vllm import FakeVllm
from eaglewire_testing.tinydata import USER_PROMPTS

PROMPTS = [[1, 2, 3], [4, 5]]
DEPTH = 3
MAX_NEW = 24


@pytest.fixture(scope="module")
def wired(tiny_drafter, tiny_targets):
    """(eaglewire's engine as trained, the same drafter fed the embedding in every slot, prompts).

    tiny:llama's greedy answers repeat one token, so a drafter trained on them copies its input token whatever
    features it is fed: fed the embedding and layers 1 and 3 (this control's wiring until 2026-12-04) it accepted
    36 of 36 rounds at every position, as on its trained layers 1, 3, 4, and the control could not fail. The
    embedding in every slot is no layer the drafter saw, and costs it 0.44-0.54 of position 0's acceptance beyond
    `doctor live`'s tolerance on three training seeds; the margin is checked here so that a tiny target or drafter
    that voids the control says so instead of failing as a doctor bug. (A real engine collects each layer once
    and would refuse repeated ids; the stand-in only needs a server whose drafts differ from the prediction.)"""
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.targets.points import points_from_ids

    t = tiny_targets["llama"]
    drafter, points, _ = load_drafter_for(t, tiny_drafter[0])
    wrong = points_from_ids([0, 0, 0], "vllm", t.num_layers)
    assert {p.name for p in wrong} == {"embed"} and "embed" not in [p.name for p in points]
    good, bad = SpecEngine(t, drafter, points), SpecEngine(t, drafter, wrong)
    prompts = [good.encode(f"{p} ({i})") for i, p in enumerate(USER_PROMPTS[:6])]  # as the drafter was trained
    _require_margin(good, bad, prompts)
    return good, bad, prompts


def _require_margin(good, bad, prompts) -> None:
    """The negative control means something only when the miswired drafter accepts, at some position, more than
    `doctor live`'s tolerance away from the drafter as trained; twice it, so that a retrained drafter does not
    land on the edge. Measured on eaglewire's own engine, as the stand-in serves it."""
    from eaglewire.doctor.live import predicted_acceptance, tolerance

    g, b = (predicted_acceptance(e, prompts, DEPTH, MAX_NEW) for e in (good, bad))
    tol = [tolerance(c, g.drafts) for c in g.accepted_per_pos]
    if not any(abs(x - y) > 2 * d for x, y, d in zip(g.rates(), b.rates(), tol)):
        pytest.fail(f"negative control void: the tiny drafter accepts {g.accepted_per_pos}/{g.drafts} per position "
                    f"as trained and {b.accepted_per_pos}/{b.drafts} miswired, within twice doctor live's tolerance "
                    f"{[round(d, 3) for d in tol]}: its drafts do not depend on what it is fed")


def _live(srv, engine, prompts, **kw):
    return doctor_live(srv.url, engine, prompts, MAX_NEW, say=lambda m: None, **kw)


@pytest.mark.unit
def test_sglang_serving_the_drafter_as_trained_passes(wired):
    """Before: `HTTP 404 from /version`, exit 2, since SGLang has no /version."""
    good, _, prompts = wired
    with FakeSglang(rounds_of(good, DEPTH), depth=DEPTH) as srv:
        rep = _live(srv, good, prompts)
    assert rep.exit_code() == 0, rep.to_dict()
    assert rep.data["engine"] == "sglang 0.5.23" and rep.data["depth"] == DEPTH
    assert rep.data["served"]["accepted_per_pos"] == rep.data["predicted"]["accepted_per_pos"]
    assert rep.data["served"]["drafts"] > 10 and rep.data["served"]["accepted_per_pos"][0] > 0


@pytest.mark.unit
def test_sglang_feeding_the_drafter_other_layers_fails_at_a_position(wired):
    good, bad, prompts = wired
    static = []
    with FakeSglang(rounds_of(bad, DEPTH), depth=DEPTH) as srv:
        rep = _live(srv, good, prompts, static_check=lambda eng: static.append(eng))
    failed = [c.name for c in rep.checks if not c.ok and c.level != "warning"]
    assert rep.exit_code() == 1 and any(n.startswith("position ") for n in failed), rep.to_dict()
    assert static and static[0].name == "sglang"  # doctor config runs on what SGLang loaded, to name the fix


def _offline(depth: int) -> Acceptance:
    return Acceptance(2, [1, 0, 0][:depth])


def _meta(**edit):
    return lambda m: {**m, **edit}


IMPOSSIBLE = {  # each reply: 4 tokens from one prefill token and one round that accepted 2 drafts
    "round beyond the depth": (_meta(spec_correct_drafts_histogram=[0, 0, 0, 0, 1], spec_num_correct_drafts=4),
                               r"1 round\(s\) accepted 4 drafts, but the server drafts 3 per round"),
    "histogram against verify count": (_meta(spec_verify_ct=5), r"counts 1 rounds but spec_verify_ct is 5"),
    "correct drafts against histogram": (_meta(spec_num_correct_drafts=9),
                                         r"spec_num_correct_drafts is 9 but the histogram sums to 2"),
    "more tokens than rounds commit": (_meta(completion_tokens=40), r"completion_tokens is 40 but 4 output_ids"),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_meta_info_blames_the_server_not_the_wiring(case):
    edit, words = IMPOSSIBLE[case]
    with FakeSglang(meta=edit, depth=DEPTH) as srv:
        rep = doctor_live(srv.url, None, PROMPTS, 4, offline=_offline, say=lambda m: None)
    (check,) = [c for c in rep.checks if not c.ok]
    assert check.name == "server counters" and re.search(words, check.detail), check.detail
    assert "not of the drafter's wiring" in check.fix and "predicted" not in rep.data


@pytest.mark.unit
def test_sglang_without_speculation_is_told_how_to_start_it():
    with FakeSglang(info=server_info(algorithm=None)) as srv:
        rep = doctor_live(srv.url, None, PROMPTS, 4, offline=_offline, say=lambda m: None)
        assert srv.generated == 0
    (check,) = [c for c in rep.checks if not c.ok]
    assert check.name == "speculation" and "--speculative-algorithm EAGLE3" in check.fix


@pytest.mark.unit
def test_a_tree_is_refused_in_one_line_naming_the_chain_settings():
    with FakeSglang(info=server_info(topk=4)) as srv, pytest.raises(EaglewireError) as e:
        doctor_live(srv.url, None, PROMPTS, 4, offline=_offline, say=lambda m: None)
    assert "speculative_eagle_topk is 4" in str(e.value) and "--speculative-eagle-topk 1" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_a_server_of_no_known_kind_gets_one_line_naming_every_route_tried():
    with FakeVllm(version={}) as srv:
        base = srv.httpd.RequestHandlerClass

        class Nothing(base):
            def do_GET(self):  # noqa: N802
                return self.send_error(404)

        srv.httpd.RequestHandlerClass = Nothing
        with pytest.raises(EaglewireError) as e:
            doctor_live(srv.url, None, PROMPTS, 4, offline=_offline, say=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg and "neither llama-server, SGLang nor vLLM" in msg
    for route in ("/props", "/server_info", "/get_server_info", "/version"):
        assert route in msg, (route, msg)


@pytest.mark.integration
def test_the_stand_ins_routes_and_fields_are_sglang_0_5_23s():
    """The names `doctor live` and the stand-in speak, found in the pinned SGLang's own source: a release that
    renames a route or a meta_info field fails here, not on a user's server."""
    from eaglewire.targets.points import PINNED
    from eaglewire_testing.engine_code import sources, wheel

    src = sources(wheel("sglang", PINNED["sglang"]), "sglang/srt/")
    http = src["sglang/srt/entrypoints/http_server.py"]
    for route in sglang.SERVER_INFO_ROUTES:
        assert f'@app.get("{route}")' in http, route
    assert f'"{sglang.GENERATE_ROUTE}",\n    methods=["POST", "PUT"]' in http
    assert '@app.get("/version")' not in http  # why SGLang is told apart from vLLM by /server_info
    tm = src["sglang/srt/managers/tokenizer_manager.py"]
    for f in sglang.META_FIELDS:
        assert f'meta_info["{f}"]' in tm or f'"{f}": recv_obj.{f}[i]' in tm, f
    assert '"output_ids": ' in tm and '"meta_info": meta_info' in tm
    # a histogram entry k counts rounds that accepted k drafts (the bonus token not counted)
    sb = src["sglang/srt/managers/schedule_batch.py"]
    assert "self.spec_correct_drafts_histogram[num_correct_drafts] += 1" in sb
    spec_fields = src["sglang/srt/arg_groups/fields/spec.py"]
    for k in sglang.SPEC_SETTINGS:
        assert re.search(rf"^\s+{k}: ", spec_fields, re.M), k
    body = sglang.generate_body([1], 1)
    for k in body:
        assert re.search(rf"^\s+{k}: ", src["sglang/srt/managers/io_struct.py"], re.M), k
    for k in body["sampling_params"]:
        assert re.search(rf"^\s+{k}: ", src["sglang/srt/sampling/sampling_params.py"], re.M), k
