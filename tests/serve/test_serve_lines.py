"""What `serve` says is the real cause: nothing drafted is not "differs", prompts that cannot fit are named, and
a server's log is echoed as printable text."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from eaglewire.doctor.verdict import Check, Report
from eaglewire.engines.vllm_server import ServeSpec, VllmServer
from eaglewire.infra.errors import EaglewireError
from eaglewire.serve import serving
from eaglewire.serve.config import ServeConfig

pytestmark = pytest.mark.unit


class FakeServer:
    name = "llama-server"

    def __init__(self):
        self.spec, self.stopped = SimpleNamespace(url="http://127.0.0.1:1"), False

    def stop(self):
        self.stopped = True


def _hold(monkeypatch, rep):
    monkeypatch.setattr(serving, "_check", lambda *a, **k: rep)
    server = FakeServer()
    cfg = ServeConfig(drafter=Path("x"), check_only=True)
    with pytest.raises(EaglewireError) as e:
        serving._check_and_hold(cfg, Path("x"), "tiny:llama", server, {}, Path("x"), lambda r, p: None, "")
    assert server.stopped
    return str(e.value)


def test_nothing_drafted_is_not_called_a_difference(monkeypatch, capsys):
    rep = Report("live")
    rep.checks.append(Check("speculation", False, "http://127.0.0.1:1 drafted nothing at --spec-draft-p-min 0.5 on 4 "
                            "prompts, nor does eaglewire's prediction", "serve with a lower --p-min"))
    msg = _hold(monkeypatch, rep)
    assert "differs" not in msg
    assert msg.startswith("http://127.0.0.1:1: nothing compared: http://127.0.0.1:1 drafted nothing") and "lower --p-min" in msg


def test_a_real_difference_still_says_so(monkeypatch, capsys):
    rep = Report("live")
    rep.add("position 0", False, "served accepts 0.100 (1/10), eaglewire predicts 0.900 (9/10)")
    assert "the served acceptance differs from eaglewire's" in _hold(monkeypatch, rep)


def test_check_prompts_that_cannot_fit_are_named():
    with pytest.raises(EaglewireError, match=r"^--max-model-len 16: every one of the 2 check prompts needs more "
                                             r"\(the shortest is 12 tokens, plus --max-new-tokens 64\)"):
        serving.fitting_prompts([[1] * 12, [1] * 30], 64, 16)
    assert serving.fitting_prompts([[1] * 12, [1] * 30], 4, 16) == [[1] * 12]


def test_a_server_log_tail_is_printable(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"loading\x00\x00 model\r\n\x1b[31mRuntimeError: \x1b]0;owned\x07bad\x1b[0m weights\x07\xc2\x9b2J\n")
    srv = VllmServer("py", ServeSpec(target_dir=tmp_path, drafter_dir=None), log)
    tail = srv.log_tail()
    assert tail == "RuntimeError: bad weights", repr(tail)
    log.write_bytes(b"\x1b[2Jplain\x00 line\nlast\tline\n")
    assert srv.log_tail() == "plain line | last\tline"
    log.write_text("ValueError: " + "x" * 50000 + "\n")
    assert len(srv.log_tail()) < 2100
