"""The server wrapper's failures are one line each (no vLLM needed): port taken, server died; the counter parser."""

import socket
import sys

import pytest

from eaglewire.engines.vllm_server import (
    ServeSpec,
    VllmServer,
    counter_delta,
    engine_command,
    free_port,
)
from eaglewire.infra.errors import EaglewireError


def test_engine_command_is_python_dash_m_with_the_speculative_config(tmp_path):
    spec = ServeSpec(target_dir=tmp_path / "t", drafter_dir=tmp_path / "d", depth=2, port=8123, dtype="float32")
    cmd = engine_command("/py", spec)
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    i = cmd.index("--speculative-config")
    assert '"num_speculative_tokens": 2' in cmd[i + 1] and '"method": "eagle3"' in cmd[i + 1]
    assert "--speculative-config" not in engine_command("/py", ServeSpec(target_dir=tmp_path, drafter_dir=None))


def test_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        spec = ServeSpec(target_dir=tmp_path, drafter_dir=None, port=s.getsockname()[1])
        with pytest.raises(EaglewireError, match="already in use"):
            VllmServer(sys.executable, spec, tmp_path / "log").start(timeout=10)


def test_a_dying_server_reports_its_log_tail(tmp_path):
    """A Python without vllm: the process exits at once and the error quotes its log."""
    spec = ServeSpec(target_dir=tmp_path, drafter_dir=None, port=free_port())
    with pytest.raises(EaglewireError, match="died during startup.*No module named"):
        VllmServer(sys.executable, spec, tmp_path / "log").start(timeout=60)


def test_counter_delta_per_position():
    before = {"drafts": 10.0, "draft_tokens": 30.0, "accepted": 5.0, "accepted_per_pos": {0: 3.0, 1: 2.0, 2: 0.0}}
    after = {"drafts": 25.0, "draft_tokens": 75.0, "accepted": 14.0, "accepted_per_pos": {0: 9.0, 1: 5.0, 2: 0.0}}
    assert counter_delta(after, before) == {"drafts": 15, "draft_tokens": 45, "accepted": 9, "accepted_per_pos": [6, 3, 0]}


def test_spec_counters_reads_vllm_prometheus_lines(monkeypatch):
    from eaglewire.engines import vllm_server

    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 243.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 729.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 40.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 14.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 13.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="1"} 1.79e+09',
    ])
    monkeypatch.setattr(vllm_server, "http_text", lambda url, timeout=60: text)
    got = vllm_server.spec_counters("http://x")
    assert got == {"drafts": 243.0, "draft_tokens": 729.0, "accepted": 40.0, "accepted_per_pos": {0: 14.0, 1: 13.0}}


def test_a_given_python_without_vllm_is_refused_in_one_line():
    from eaglewire.engines.vllm_env import find_python

    with pytest.raises(EaglewireError, match="cannot import vllm"):
        find_python(sys.executable)  # eaglewire's own venv: vLLM lives in a venv of its own
