"""The vLLM venv and llama-server are trusted only while they match the record written after their build: a
file cut short (a full disk, a killed install) is found and the build redone, where before the marker file
alone said "ready". Fake build directories under a cache of their own; the installs themselves are stood in for."""

from __future__ import annotations

import pytest

from eaglewire.engines import llama_env, vllm_env
from eaglewire.infra.buildcache import RECORD, damage, seal
from eaglewire.infra.errors import EaglewireError

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path / "cache"))


def _fake_venv(d):
    for rel, data in {"bin/python": "#!/bin/sh\n", "pyvenv.cfg": "home = /usr\n",
                      "lib/python3.11/site-packages/vllm/__init__.py": "x = 1\n" * 100,
                      "lib/python3.11/site-packages/vllm/_C.abi3.so": "\x7fELF" + "\0" * 5000}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(data)


def test_record_damage_names_what_changed(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    (d / "a.so").write_bytes(b"x" * 1000)
    (d / "b.txt").write_text("hello")
    assert damage(d) == f"no record of a complete build ({RECORD})"
    seal(d, [d / "a.so"], [d / "b.txt"])
    assert damage(d) is None
    (d / "a.so").write_bytes(b"y" * 1000)  # same size, other bytes: the hash says so
    assert damage(d) == "a.so differs from the file that was built (sha256)"
    (d / "a.so").write_bytes(b"x" * 100)
    assert damage(d) == "a.so is 100 bytes, 1000 when it was built (cut short by a full disk or a kill?)"
    (d / "a.so").unlink()
    assert damage(d) == "a.so is missing"
    for record in ('{"files": {"../../etc/passwd": {"size": 1}}}', "[", "[" * 100_000, '{"files": []}'):
        (d / RECORD).write_text(record)
        assert damage(d) is not None


def test_a_cut_short_vllm_venv_is_rebuilt(monkeypatch, capsys):
    d = vllm_env.venv_dir()
    _fake_venv(d)
    vllm_env.seal_venv(d)
    (d / vllm_env._READY).write_text(vllm_env.VLLM_VERSION)
    py = d / "bin" / "python"
    assert vllm_env.trusted(d, py)
    so = d / "lib/python3.11/site-packages/vllm/_C.abi3.so"
    so.write_bytes(so.read_bytes()[:1000])  # what a full disk during the install leaves
    steps = []

    def install(cmd, log, timeout, what="vLLM venv"):
        steps.append(cmd[1:3])
        if cmd[1:3] == ["-m", "venv"]:
            assert not d.exists()  # the damaged venv went first
            _fake_venv(d)

    monkeypatch.setattr(vllm_env, "run_logged", install)
    monkeypatch.setattr(vllm_env, "vllm_version", lambda p: vllm_env.VLLM_VERSION)
    assert vllm_env.ensure_managed() == py
    assert steps[0] == ["-m", "venv"] and damage(d) is None and so.stat().st_size == 5004
    err = capsys.readouterr().err
    assert f"[serve] the vLLM venv {d} is not used (lib/python3.11/site-packages/vllm/_C.abi3.so is 1000 bytes, " \
           "5004 when it was built" in err


def test_a_venv_from_before_records_is_recorded_when_it_imports(monkeypatch):
    d = vllm_env.venv_dir()
    _fake_venv(d)
    (d / vllm_env._READY).write_text(vllm_env.VLLM_VERSION)
    monkeypatch.setattr(vllm_env, "vllm_version", lambda p: vllm_env.VLLM_VERSION)
    assert vllm_env.ensure_managed() == d / "bin" / "python" and damage(d) is None


class _Stop(Exception):
    """Ends a stood-in download: what follows it is not under test."""


def _fake_llama(binary: str = "#!/bin/sh\necho version: 1\n"):
    b = llama_env.server_binary()
    b.parent.mkdir(parents=True, exist_ok=True)
    b.write_text(binary)
    b.chmod(0o755)
    src = llama_env.source_dir()
    (src / "gguf-py" / "gguf").mkdir(parents=True, exist_ok=True)
    (src / "convert_hf_to_gguf.py").write_text("print('convert')\n" * 50)
    (src / "gguf-py" / "gguf" / "__init__.py").write_text("x = 1\n")
    (llama_env.home() / ".source-ready").write_text("x\n")
    (llama_env.home() / llama_env._READY).write_text("x\n")
    return b


def test_a_cut_short_llama_server_is_not_used_and_is_rebuilt(monkeypatch, capsys):
    b = _fake_llama()
    assert llama_env.is_built()  # built before records were kept: it runs, so it is recorded now
    assert damage(llama_env.home() / "build") is None
    b.write_text("#!/bin/sh\n")  # cut short
    assert not llama_env.is_built()
    with pytest.raises(EaglewireError, match=rf"llama-server {b} is damaged \(bin/llama-server is 10 bytes, 26 when "
                       r"it was built .*\): rebuild it with `python -m eaglewire.engines.llama_env`"):
        llama_env.find_server(install=False)
    steps = []

    def build(cmd, log, timeout, what="vLLM venv"):
        steps.append(cmd[:2])
        if cmd[:2] == ["cmake", "-S"]:
            assert not b.exists()  # the damaged build went first: cmake would have called it up to date
        else:
            _fake_llama()

    monkeypatch.setattr(llama_env, "run_logged", build)
    monkeypatch.setattr(llama_env.shutil, "which", lambda name: "/usr/bin/" + name)
    assert llama_env.find_server() == b and steps == [["cmake", "-S"], ["cmake", "--build"]]
    assert llama_env.is_built() and "is not used (bin/llama-server is 10 bytes" in capsys.readouterr().err


def test_a_damaged_converter_is_unpacked_again(monkeypatch):
    _fake_llama()
    src = llama_env.ensure_source()  # recorded now
    (src / "convert_hf_to_gguf.py").write_text("print('conv")  # cut short
    unpacked = []

    def download(cmd, *a, **k):
        unpacked.append(cmd)
        raise _Stop

    monkeypatch.setattr(llama_env, "run_logged", download)
    with pytest.raises(_Stop):
        llama_env.ensure_source()
    assert unpacked and "download" in unpacked[0] and not (llama_env.home() / ".source-ready").exists()
