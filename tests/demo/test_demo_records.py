"""Issue 58: a demo rerun on a directory continues it only with its recorded settings, and a second demo on a
running demo's directory is refused before it writes anything (demo.config.json included)."""

from __future__ import annotations

import fcntl
import os

import pytest

from eaglewire.demo import run as demo_run
from eaglewire.demo.config import PRESETS, DemoConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import save_config

pytestmark = pytest.mark.unit


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A quick demo's directory on tiny:llama as its first run left it; no stage may run in these tests."""
    def no_stage(*a, **k):
        raise AssertionError("a stage ran")

    monkeypatch.setattr(demo_run, "run_build", no_stage)
    run = tmp_path / "demo"
    run.mkdir()
    save_config(DemoConfig(preset="quick", target="tiny:llama", run_dir=run), run / "demo.config.json",
                {"preset_values": PRESETS["quick"]})
    return run


def _contents(run):
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize("change,said", [({"preset": "standard"}, "--preset 'standard' (recorded: 'quick')"),
                                         ({"target": "tiny:qwen3"}, "--target 'tiny:qwen3' (recorded: 'tiny:llama')"),
                                         ({"seed": 3}, "--seed 3 (recorded: 0)")])
def test_a_rerun_with_other_settings_is_refused_naming_them(started, change, said):
    before = _contents(started)
    cfg = DemoConfig(**{"preset": "quick", "target": "tiny:llama", "run_dir": started, **change})
    with pytest.raises(EaglewireError, match="started with other settings") as e:
        demo_run.run_demo(cfg)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert _contents(started) == before


def test_a_second_demo_on_a_running_demos_directory_writes_nothing(started):
    before = _contents(started)
    fd = os.open(started / ".eaglewire.lock", os.O_RDWR | os.O_CREAT, 0o644)  # the running demo's lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"4242\n", 0)
        before = _contents(started)
        with pytest.raises(EaglewireError, match=r"another eaglewire process \(PID 4242\)"):
            demo_run.run_demo(DemoConfig(preset="standard", target="tiny:llama", run_dir=started))
        assert _contents(started) == before
    finally:
        os.close(fd)
