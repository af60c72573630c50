"""A cached kernel build is checked against the record written after it was built, before it is loaded: a `.so`
cut short (a full disk, a killed build) killed every later process with SIGBUS and no message, and the builder
called it up to date. Now it is rebuilt, or the oneDNN path is used when that fails, with a line saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch.nn.functional as F

import eaglewire.targets.smallm as smallm
from eaglewire.infra.buildcache import RECORD, damage, seal
from eaglewire.targets.load import cache_dir

# a `c++` first on PATH that answers the toolchain's questions as the real one does but fails every compile and
# link: a rebuild fails at once, so what a damaged cache leads to shows without a minute of compiling (the build
# command names `c++` as before, so ninja still calls the cached build up to date)
CXX = """#!/bin/sh
for a in "$@"; do case "$a" in *.cpp|*.o|-shared) echo "c++: refusing to build" >&2; exit 1;; esac; done
exec {real} "$@"
"""


@pytest.fixture(scope="module")
def built() -> Path:
    why = smallm.unavailable_reason()
    if why is not None:
        if os.environ.get("CI") == "true" and "EAGLEWIRE_KERNELS" not in os.environ:
            pytest.fail(f"CI machine cannot build the kernel: {why}")
        pytest.skip(why)
    assert smallm.smallm_kernel() is not None, smallm._STATE.get("why")
    return cache_dir() / "kernels" / f"smallm-{smallm.kernel_key()}"


def test_a_cut_short_cached_kernel_is_not_loaded_and_the_fallback_says_why(built, tmp_path):
    """The real build, copied to a cache of its own and cut to 100 kB: loaded in a child process (a SIGBUS there
    cannot take pytest with it), as every `generate` loads it."""
    dst = tmp_path / "cache" / "kernels" / built.name
    shutil.copytree(built, dst, ignore=shutil.ignore_patterns("lock", ".ninja_lock"))
    so = next(dst.glob("*.so"))
    size = so.stat().st_size
    with open(so, "r+b") as f:
        f.truncate(100_000)
    os.utime(so)  # newer than its sources and objects: ninja calls it up to date
    cxx = tmp_path / "bin" / "c++"
    cxx.parent.mkdir()
    cxx.write_text(CXX.format(real=shutil.which(os.environ.get("CXX", "c++"))))
    cxx.chmod(0o755)
    code = "from eaglewire.targets import smallm; print(smallm.smallm_kernel() is None)"
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(EAGLEWIRE_CACHE=str(tmp_path / "cache"), PATH=f"{cxx.parent}{os.pathsep}{env.get('PATH', '')}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (-7: SIGBUS): {r.stderr[-500:]}"
    assert r.stdout.strip() == "True"  # no kernel: the oneDNN path, exactly as EAGLEWIRE_KERNELS=0
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("[kernels]")]
    assert notes[0] == (f"[kernels] the cached kernel in {dst} is not used ({so.name} is 100000 bytes, {size} when "
                        "it was built (cut short by a full disk or a kill?)); rebuilding it (~1 min)")
    assert len(notes) == 2 and notes[1].endswith("verify falls back to oneDNN"), notes


def _fake_load(loads: list):
    def load(name, sources, build_directory, **kw):
        d = Path(build_directory)
        loads.append(sorted(p.name for p in d.iterdir()))
        so = d / f"{name}.so"
        if not so.exists():
            so.write_bytes(b"rebuilt" * 100)
        return types.SimpleNamespace(__file__=str(so), linear=lambda x, w, b=None: F.linear(x, smallm.widened(w), b))
    return load


@pytest.mark.unit
def test_a_damaged_build_is_rebuilt_from_nothing_and_then_trusted(tmp_path, monkeypatch, capsys):
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    build = tmp_path / "kernels" / f"smallm-{smallm.kernel_key()}"
    build.mkdir(parents=True)
    so = build / f"eaglewire_smallm_{smallm.kernel_key()}.so"
    so.write_bytes(b"\x7fELF" + bytes(1000))
    seal(build, [so])
    so.write_bytes(b"\x7fELF" + bytes(100))  # cut short after it was recorded
    (build / "smallm.o").write_bytes(b"an object ninja would trust")
    (build / "lock").write_text("")  # torch's build lock, left by a killed build: it would wait forever
    loads: list = []
    monkeypatch.setattr(ext, "load", _fake_load(loads))
    mod, why = smallm._build()
    assert why is None and loads == [[]]  # everything of the damaged build was gone before the rebuild
    assert damage(build) is None and Path(mod.__file__) == so
    err = capsys.readouterr().err
    assert f"{so.name} is 104 bytes, 1004 when it was built" in err and "rebuilding it" in err
    smallm._build()  # whole now: loaded as it is, without a word
    assert loads[1] == sorted([RECORD, so.name]) and capsys.readouterr().err == ""


@pytest.mark.unit
def test_a_build_without_a_record_is_not_trusted(tmp_path, monkeypatch, capsys):
    """A cache from before records were kept, or one whose build was killed before its record: rebuilt once."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    build = tmp_path / "kernels" / f"smallm-{smallm.kernel_key()}"
    build.mkdir(parents=True)
    (build / f"eaglewire_smallm_{smallm.kernel_key()}.so").write_bytes(b"\x7fELF" + bytes(100))
    loads: list = []
    monkeypatch.setattr(ext, "load", _fake_load(loads))
    smallm._build()
    assert loads == [[]] and f"no record of a complete build ({RECORD})" in capsys.readouterr().err
