"""`doctor live` against servers that lie, stall or trickle (the stand-ins of test_live.py, with llama-server's
routes from fake_llama): impossible counters are the server's fault, named as such before any comparison;
one deadline bounds the whole check, stated at the start, with a line per prompt; a broken /props is named."""

from __future__ import annotations

import re
import time

import pytest

import eaglewire.doctor.live as live
from eaglewire.doctor.live import Acceptance, doctor_live
from eaglewire.engines.http import ChatClient, DeadlineExpired, deadline
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.fake_llama import llama_like
from eaglewire_testing.fake_vllm import FakeVllm, counters

pytestmark = pytest.mark.unit
PROMPTS = [[1, 2, 3], [4, 5]]


def _offline(depth: int) -> Acceptance:  # eaglewire's prediction: what a good server accepts
    return Acceptance(10, [6, 3][:depth])


def _live(srv: FakeVllm, say=None, **kw):
    static = []
    rep = doctor_live(srv.url, None, PROMPTS, 4, static_check=lambda eng: static.append(eng), offline=_offline,
                      say=say if say is not None else (lambda m: None), **kw)
    return rep, static


def _llama(text: str) -> str:
    return text.replace("vllm:", "llamacpp:")


def _labelled(drafts: int, acc: dict[int, int]) -> str:
    lab = 'engine="0",model_name="m"'
    return "".join([f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}\n",
                    *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {a}\n'
                      for p, a in acc.items())])


IMPOSSIBLE = {
    "50 accepted over 1 draft": ([counters(0, [0, 0]), counters(1, [50, 0])],
                                 r"50 accepted at position 0 over 1 draft \(a round accepts a position at most once; "
                                 r"mean acceptance length 51\.00, possible only in \[1, 3\]\)"),
    "mean length 181": ([counters(0, [0, 0]), counters(1, [90, 90])], r"mean acceptance length 181\.00"),
    "later position accepted more": ([counters(0, [0, 0]), counters(10, [3, 7])],
                                     r"7 accepted at position 1 but 3 at position 0"),
    "positions 0 and 200": ([_labelled(0, {0: 0, 200: 0}), _labelled(10, {0: 6, 200: 3})],
                            r"labelled position 0, 200: not 0\.\.1"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_impossible_counters_blame_the_server_not_the_wiring(case, engine):
    """Before: per-position rows compared 50/1 with eaglewire's prediction and blamed the wiring (or read the
    counters at positions 0 and 200 as positions 0 and 1 and passed)."""
    metrics, why = IMPOSSIBLE[case]
    with FakeVllm(metrics=[_llama(m) for m in metrics] if engine == "llama.cpp" else metrics) as srv:
        if engine == "llama.cpp":
            llama_like(srv)
        rep, static = _live(srv)
    assert rep.exit_code() != 0 and [c.name for c in rep.checks] == ["engine", "server counters"]
    bad = rep.checks[-1]
    assert not bad.ok and bad.detail.startswith(f"{srv.url}/metrics: ")
    assert re.search(why, bad.detail), bad.detail
    assert "not of the drafter's wiring" in bad.fix and "\n" not in bad.detail + bad.fix
    assert static == []  # the wiring's config check (the fix for a wiring bug) is not run either
    assert rep.checks[0].detail.startswith(engine)


def test_possible_counters_are_still_compared():
    with FakeVllm(metrics=[counters(5, [1, 1]), counters(15, [7, 4])]) as srv:
        llama_like(srv, llama=False)
        rep, _ = _live(srv)
    assert rep.exit_code() == 0 and rep.data["served"]["accepted_per_pos"] == [6, 3]


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_a_trickling_completion_ends_at_the_one_deadline_saying_how_far_it_got(engine):
    """Before: each request had its own 600 s deadline and one retry, ~20 minutes a prompt, and nothing printed."""
    lines = []
    metrics = [counters(5, [1, 1]), counters(15, [7, 4])]
    with FakeVllm(metrics=[_llama(m) for m in metrics] if engine == "llama.cpp" else metrics) as srv:
        llama_like(srv, trickle_s=0.1, llama=engine == "llama.cpp")
        t0 = time.monotonic()
        with pytest.raises(EaglewireError) as e:
            _live(srv, say=lines.append, deadline_s=1.5)
        took = time.monotonic() - t0
    assert took < 4, took
    assert str(e.value) == (f"{srv.url}: doctor live's deadline of 1.5 s ran out while waiting for the server's answer "
                            "to prompt 1 of 2 (0 of 2 prompts answered by the server): a server this slow cannot be "
                            "checked in time; raise --deadline, or send fewer or shorter prompts (--num-prompts, "
                            "--max-new-tokens)")
    assert lines == [f"[live] checking {srv.url} on 2 prompts of up to 4 new tokens; deadline 1.5 s for the whole "
                     "check (--deadline)"]


def test_each_prompt_prints_a_progress_line():
    lines = []
    with FakeVllm(metrics=[counters(5, [1, 1]), counters(15, [7, 4])]) as srv:
        llama_like(srv, trickle_s=0.001, llama=False)
        rep, _ = _live(srv, say=lines.append, deadline_s=60)
    assert rep.exit_code() == 0 and len(lines) == 3 and "deadline 60 s" in lines[0]
    assert [ln.split(" (")[0] for ln in lines[1:]] == ["[live] server: prompt 1/2", "[live] server: prompt 2/2"]
    assert all("3 tokens in" in ln and "of 60 s used" in ln for ln in lines[1:])


def test_every_wait_is_cut_to_what_is_left_of_the_deadline():
    """A server that never answers: the client's own 600 s and 4 retries are cut to the 1 s left."""
    with FakeVllm() as srv:
        llama_like(srv, props_stall_s=10)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExpired, match="the check's 1 s"), deadline(1.0, "the check's 1 s"):
            ChatClient(srv.url, timeout_s=600, retries=4).request("/props")
        assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("kw, words", [
    ({"props": [1, 2]}, r"/props answered a JSON list \(\[1, 2\]\)"),
    ({"props": {"model_path": "x"}}, "/props answered an object without default_generation_settings"),
    ({"props_bytes": 200 << 20}, r"/props failed \(reply larger than 4 MB\)"),
    ({"props_stall_s": 3}, r"/props failed \(.*(timed out|no complete reply within 0\.5 s)"),
])
def test_a_broken_props_is_named_not_a_missing_version(kw, words, monkeypatch):
    """Before: every one of these read "HTTP 404 from /version", the route a llama-server never had."""
    monkeypatch.setattr(live, "PROPS_TIMEOUT_S", 0.5)
    with FakeVllm() as srv:
        llama_like(srv, **kw)
        t0 = time.monotonic()
        with pytest.raises(EaglewireError, match=words) as e:
            live.engine_of(srv.url)
        assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert msg.startswith(f"{srv.url}: neither llama-server, SGLang nor vLLM: /props ") and "HTTP 404 from /version" in msg
    assert "\n" not in msg and len(msg) < 600


def test_acceptance_without_any_draft_is_the_servers_fault_not_no_speculation():
    with FakeVllm(metrics=[counters(0, [0, 0]), counters(0, [5, 0])]) as srv:
        rep, _ = _live(srv)
    assert rep.checks[-1].name == "server counters"
    assert rep.checks[-1].detail.endswith("/metrics: 5 accepted at position 0 while no round drafted")
