"""Which llama.cpp serves our drafters: a `llama-server` the user names, or one built once from pinned source.

Why build it: llama.cpp ships no Linux server binary on PyPI, but the sdist of
`llama-cpp-python` (MIT) vendors a llama.cpp with EAGLE-3 speculative decoding.
We fetch that sdist from the package index (the only network this product
assumes), build only the `llama-server` target with network features off (no
prebuilt web UI, no OpenSSL, no curl), and cache the result keyed by version.
The same tree holds llama.cpp's own `convert_hf_to_gguf.py` and `gguf-py`,
which export uses, so the GGUF writer and the server always come from one
source. Both are trusted only while they match the record written after they
were made (`infra/buildcache.py`: the server binary's and the converter's
sha256): a binary cut short by a full disk or a killed build is rebuilt, a
damaged source unpacked again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from eaglewire.engines.vllm_env import run_logged
from eaglewire.infra.buildcache import NO_RECORD, damage, seal
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import waiting_lock
from eaglewire.targets.load import cache_dir
from eaglewire.targets.registry import pinned_version

LLAMA_CPP_PYTHON = pinned_version("llama.cpp")  # the llama-cpp-python release whose llama.cpp is built
_READY = ".eaglewire-ready"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF")


def home() -> Path:
    return cache_dir() / "engines" / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def source_dir() -> Path:
    """llama.cpp's tree (converter, gguf-py, server sources) inside the unpacked sdist."""
    return home() / "src" / "vendor" / "llama.cpp"


def server_binary() -> Path:
    return home() / "build" / "bin" / "llama-server"


def gguf_py() -> Path:
    return source_dir() / "gguf-py"


def find_server(explicit: str = "", install: bool = True, timeout: int = 3600) -> Path:
    """--llama-server, else $EAGLEWIRE_LLAMA_SERVER, else the managed build (built on first use)."""
    given = explicit or os.environ.get("EAGLEWIRE_LLAMA_SERVER", "")
    if given:
        p = Path(given)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise EaglewireError(f"--llama-server {given}: not an executable file")
        return p
    if is_built():
        return server_binary()
    if not install:
        why = build_damage() if server_binary().is_file() else None
        raise EaglewireError((f"llama-server {server_binary()} is damaged ({why}): rebuild it" if why else
                              "no llama-server found: pass --llama-server, or build the pinned one") +
                             " with `python -m eaglewire.engines.llama_env` (~10-25 min)")
    return ensure_built(timeout)


def is_built() -> bool:
    return (home() / _READY).is_file() and server_binary().is_file() and build_damage() is None


def build_damage() -> str | None:
    """Why the built llama-server does not match its record (None: it does). A build from before records were
    kept is recorded now if it runs."""
    why = damage(home() / "build")
    if why == NO_RECORD and (home() / _READY).is_file() and _runs(server_binary()):
        try:
            seal(home() / "build", [server_binary()])
        except OSError:  # a read-only cache: trusted as before
            pass
        return None
    return why


def _runs(binary: Path) -> bool:
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _source_files(src: Path) -> list[Path]:
    """What export runs from the source tree: the converter and its gguf package."""
    return [p for p in [src / "convert_hf_to_gguf.py", *sorted((src / "gguf-py").rglob("*.py"))] if p.is_file()]


def _source_trusted(src: Path) -> bool:
    if not ((home() / ".source-ready").is_file() and src.is_dir()):
        return False
    why = damage(src)
    if why == NO_RECORD:  # unpacked before records were kept
        try:
            seal(src, _source_files(src))
        except OSError:
            pass
        return True
    if why is not None:
        print(f"[llama.cpp] the llama.cpp source in {src} is not used ({why}); unpacking it again", file=sys.stderr,
              flush=True)
    return why is None


def ensure_source(timeout: int = 600) -> Path:
    """Unpack the pinned sdist once; the converter needs only this, not the build."""
    src = source_dir()
    if _source_trusted(src):
        return src
    (home() / ".source-ready").unlink(missing_ok=True)
    home().mkdir(parents=True, exist_ok=True)
    log = home() / "install.log"
    dl = home() / "sdist"
    run_logged([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(dl),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log, timeout, "llama.cpp")
    archives = sorted(dl.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if not archives:
        raise EaglewireError(f"llama.cpp: pip downloaded no llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz into {dl}")
    tmp = home() / "src.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp, filter="data")  # the data filter refuses links and paths outside tmp
    shutil.rmtree(home() / "src", ignore_errors=True)
    (tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON}").rename(home() / "src")
    shutil.rmtree(tmp, ignore_errors=True)
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise EaglewireError(f"llama.cpp: the sdist has no vendor/llama.cpp/convert_hf_to_gguf.py ({src})")
    seal(src, _source_files(src))
    (home() / ".source-ready").write_text(LLAMA_CPP_PYTHON + "\n")
    return src


def ensure_built(timeout: int = 3600) -> Path:
    """Build `llama-server` once, under a lock a parallel test or command waits on."""
    if is_built():
        return server_binary()
    home().parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(home().parent / f".llama.cpp-{LLAMA_CPP_PYTHON}.lock"):
        if is_built():
            return server_binary()
        if server_binary().is_file():  # cut short, or not the binary that was built: cmake would call it up to date
            print(f"[llama.cpp] llama-server {server_binary()} is not used ({build_damage()}); rebuilding it",
                  file=sys.stderr, flush=True)
            (home() / _READY).unlink(missing_ok=True)
            shutil.rmtree(home() / "build", ignore_errors=True)
        if shutil.which("cmake") is None:
            raise EaglewireError("llama.cpp: building llama-server needs cmake and a C++ compiler "
                                 "(apt install cmake g++), or pass --llama-server")
        src = ensure_source()
        log = home() / "install.log"
        build = home() / "build"
        jobs = str(os.cpu_count() or 2)
        print(f"[llama.cpp] building llama-server once from llama-cpp-python {LLAMA_CPP_PYTHON}'s llama.cpp "
              f"(~10-25 min on 2 cores): {build} (log {log})", file=sys.stderr, flush=True)
        run_logged(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], log, timeout, "llama.cpp")
        run_logged(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], log, timeout, "llama.cpp")
        if not server_binary().is_file():
            raise EaglewireError(f"llama.cpp: the build finished without {server_binary()} (log {log})")
        seal(build, [server_binary()])
        (home() / _READY).write_text(LLAMA_CPP_PYTHON + "\n")
    return server_binary()


if __name__ == "__main__":  # `.ci/run` builds it before the tests: python -m eaglewire.engines.llama_env
    print(ensure_built())
