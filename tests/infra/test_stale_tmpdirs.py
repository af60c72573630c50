"""What a killed run left half-written is removed by the next run in the same place; a live run's never is.

Before: `kill -9` during a GGUF export left its hidden temporary directory (221 MB) beside --out, and no rerun
removed it (the names were random, with nothing saying whether their owner was alive).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from eaglewire.infra.atomic import STALE_AGE_S, atomic_dir, owned_tmpdir

pytestmark = pytest.mark.unit

HOLDER = '''
import sys, time
from pathlib import Path
from eaglewire.infra.atomic import atomic_dir
with atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "big.part").write_bytes(b"x" * 1000)
    print(tmp, flush=True)
    time.sleep(600)
'''


def _holder(out):
    """A process inside atomic_dir(out), as an export is while the converter runs: (process, its temp dir)."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line, "the holder did not start"
    return p, type(out)(line)


def _age(d, seconds=STALE_AGE_S + 5):
    t = time.time() - seconds
    os.utime(d, (t, t))


def test_a_killed_runs_temp_dir_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "export"
    p, tmp = _holder(out)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert tmp.is_dir() and tmp.name.startswith(".export.")  # what kill -9 leaves
    _age(tmp)
    with atomic_dir(out) as new:
        (new / "f").write_text("1")
    assert not tmp.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["export"]


def test_a_live_runs_temp_dir_is_kept(tmp_path):
    out = tmp_path / "export"
    p, tmp = _holder(out)
    try:
        _age(tmp)
        with atomic_dir(out) as new:
            (new / "f").write_text("1")
        assert (tmp / "big.part").is_file(), "a live run's temporary directory was removed"
    finally:
        p.kill()
        p.wait()


def test_an_earlier_versions_leftover_and_young_dirs(tmp_path):
    """mkdtemp's random names (what earlier versions left) are removed once old; a young one may belong to a run
    that has not locked it yet, and anything not named like ours is never touched."""
    old_style, young = tmp_path / ".export.ab12cd_3", tmp_path / ".export.tmp-young"
    mine, file_like = tmp_path / ".export.notours-1", tmp_path / ".export.zz99yy88"
    for d in (old_style, young, mine):
        d.mkdir()
        (d / "x").write_text("x")
    file_like.write_text("a file, not a directory")
    _age(old_style)
    _age(mine)
    _age(file_like)
    with owned_tmpdir(tmp_path, ".export.") as t:
        assert t.is_dir()
    assert not old_style.exists() and young.is_dir() and mine.is_dir() and file_like.is_file()
