"""`doctor live` checks what it talks to (fake vLLM servers, no vLLM needed): the served model is the
drafter's target, every reply and counter has the shape and range vLLM gives, counters never go back,
and a trickling /metrics ends at a deadline. Each is one line."""

from __future__ import annotations

import time

import pytest

from eaglewire.doctor.live import Acceptance, doctor_live
from eaglewire.engines.vllm_server import http_text, served_model, spec_counters
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.fake_vllm import FakeVllm, counters, models

PROMPTS = [[1, 2, 3], [4, 5]]


def _offline(depth: int) -> Acceptance:  # eaglewire's prediction: what the good server below accepts
    return Acceptance(10, [6, 3][:depth])


def _live(srv: FakeVllm, target=("m",)):
    return doctor_live(srv.url, None, PROMPTS, 4, offline=_offline, target=list(target) if target else None)


GOOD = [counters(5, [1, 1]), counters(15, [7, 4])]


def test_a_server_running_the_drafters_target_is_compared():
    with FakeVllm(served=models("llama", root="/models/tiny:llama"), metrics=GOOD) as srv:
        rep = _live(srv, target=("tiny:llama",))
    assert rep.exit_code() == 0 and rep.data["served"]["accepted_per_pos"] == [6, 3]


def test_a_server_running_another_model_is_refused_before_any_verdict():
    with FakeVllm(served=models("Qwen/Qwen3-8B"), metrics=GOOD) as srv:
        with pytest.raises(EaglewireError, match=r"runs Qwen/Qwen3-8B, not the drafter's target tiny:llama"):
            _live(srv, target=("tiny:llama", "/cache/tiny-llama"))
        assert srv.gets == 0  # nothing was measured, so nothing is blamed on wiring


def test_the_matching_model_is_chosen_among_several():
    with FakeVllm(served=models("other", "alias", root=None)) as srv:
        srv.served["data"][1]["root"] = "/srv/Llama-3.1-8B/"
        assert served_model(srv.url, ["meta-llama/Llama-3.1-8B"]) == "alias"


@pytest.mark.parametrize("served, words", [
    ({"data": ["m"]}, r"data\[0\] is not a model entry"),
    ({"data": [{"id": 7}]}, r"data\[0\] is not a model entry"),
    ({"data": {"id": "m"}}, "expected `data` to be a list"),
    ([{"id": "m"}], "expected a JSON object, got list"),
])
def test_models_of_the_wrong_shape_are_one_line(served, words):
    with FakeVllm(served=served) as srv, pytest.raises(EaglewireError, match=words):
        served_model(srv.url)


@pytest.mark.parametrize("version", [["0.32.0"], {"version": ["0", "32"]}])
def test_a_version_of_the_wrong_shape_is_one_line(version):
    with FakeVllm(version=version, metrics=GOOD) as srv, pytest.raises(EaglewireError, match="/version: expected"):
        _live(srv)


@pytest.mark.parametrize("value", ["abc", "NaN", "-3", "+Inf", "1e400", "1e"])
def test_a_metric_that_is_not_a_count_is_one_line(value):
    text = GOOD[0].replace("num_drafts_total{engine=\"0\",model_name=\"m\"} 5", f"num_drafts_total{{engine=\"0\"}} {value}")
    assert value in text
    with FakeVllm(metrics=[text]) as srv, pytest.raises(EaglewireError, match=r"/metrics line 2: .*is not a count"):
        spec_counters(srv.url)


@pytest.mark.parametrize("labels", ['{engine="0"}', "", '{position="100000"}'])
def test_a_per_position_counter_without_its_position_is_one_line(labels):
    text = f"vllm:spec_decode_num_accepted_tokens_per_pos_total{labels} 4\n"
    with FakeVllm(metrics=[text]) as srv, pytest.raises(EaglewireError, match=r'line 1: .*position="N"'):
        spec_counters(srv.url)


def test_counters_going_backwards_are_refused_not_counted():
    """A server restarted between the two reads: negative counts and a verdict before; now one line."""
    with FakeVllm(metrics=[counters(15, [7, 4]), counters(5, [1, 1])]) as srv:
        with pytest.raises(EaglewireError, match=r"drafts went from 15 to 5 during the run \(did the server restart"):
            _live(srv)


def test_a_trickling_metrics_page_ends_at_the_deadline():
    with FakeVllm(metrics=[counters(1, [1, 1]) * 3], trickle_s=0.05) as srv:
        t0 = time.monotonic()
        with pytest.raises(EaglewireError, match="no complete reply within 1 s"):
            http_text(srv.url + "/metrics", timeout=1)
        assert time.monotonic() - t0 < 5
