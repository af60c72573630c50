"""A separate virtual environment holding the real `speculators` package.

Why a separate venv: speculators 0.9.0 pins transformers<=5.19 while
eaglewire runs on 5.24, so the two cannot share an interpreter. The venv is
built once under the eaglewire cache and reused by tests and benchmarks.

Why these pins (measured on the 2-core CPU machine): `torch==2.13.0` is the
CPU wheel on this machine's disk (an unpinned torch would pull a multi-GB CUDA
build); `hs-connectors` and `speculators` go in with --no-deps because their
full dependency sets drag GPU-only transfer engines; the import-time
dependencies are listed explicitly instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

SPECULATORS_VERSION = "0.9.0"
# Import-time requirements of speculators 0.9.0 (its METADATA, minus the
# GPU/transfer extras and torchaudio/torchvision, which it does not import).
DEPS = [
    "torch==2.13.0", "transformers<=5.19.0,>=5.0.0", "safetensors", "numpy<=2.5.4,>=2.0.0",
    "tqdm<=4.70.1,>=4.66.3", "pydantic>=2.0.0", "pydantic-settings>=2.0.0", "loguru<=0.7.3,>=0.7.2",
    "openai>=2.0.0", "aiohttp", "datasets<=5.1.0,>=4.0.0", "httpx", "huggingface-hub", "click",
    "protobuf", "psutil", "rich", "typer>=0.12.0",
]
NO_DEPS = [f"hs-connectors=={SPECULATORS_VERSION}", f"speculators=={SPECULATORS_VERSION}"]
_READY = ".eaglewire-ready"


def venv_dir() -> Path:
    from eaglewire.targets.load import cache_dir

    return cache_dir() / "venvs" / f"speculators-{SPECULATORS_VERSION}"


def venv_python(d: Path | None = None) -> Path:
    return (d or venv_dir()) / "bin" / "python"


def _run(cmd: list[str], log: Path, timeout: int) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if r.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise EaglewireError(f"speculators venv: `{' '.join(cmd[:4])} ...` failed (exit {r.returncode}); "
                             f"log {log}: " + " | ".join(tail))


def ensure_speculators_venv(timeout: int = 1800) -> Path:
    """Build (once) and return the python of a venv where `import speculators` works.

    The ready marker is written last, so an interrupted install is redone
    rather than half-used.
    """
    d = venv_dir()
    py = venv_python(d)
    if (d / _READY).is_file() and py.is_file():
        return py
    d.parent.mkdir(parents=True, exist_ok=True)
    log = d.parent / f"{d.name}.install.log"
    log.write_text("")
    if not py.is_file():
        _run([sys.executable, "-m", "venv", str(d)], log, timeout)
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    _run(pip + DEPS, log, timeout)
    _run(pip + ["--no-deps"] + NO_DEPS, log, timeout)
    _run([str(py), "-c", "import speculators.models.eagle3 as m; print(m.__file__)"], log, timeout)
    (d / _READY).write_text(SPECULATORS_VERSION + "\n")
    return py


def speculators_logits(export_dir: Path, features, input_ids, workdir: Path, timeout: int = 600) -> list:
    """Draft logits of TTT steps 0 and 1 computed by speculators' own Eagle3DraftModel.

    Runs speculators_check.py in the separate venv (offline: the verifier named
    in the export's config must be a local directory).
    """
    import torch
    from safetensors.torch import load_file, save_file

    py = ensure_speculators_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    inp, out = workdir / "spec_inputs.safetensors", workdir / "spec_logits.safetensors"
    save_file({"features": features.float().contiguous(), "input_ids": input_ids.long().contiguous()}, str(inp))
    script = Path(__file__).with_name("speculators_check.py")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    r = subprocess.run([str(py), str(script), str(export_dir), str(inp), str(out)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0:
        raise EaglewireError(f"speculators could not run {export_dir}: " + (r.stderr or r.stdout)[-2000:])
    got = load_file(str(out))
    return [got[f"logits_{k}"] for k in range(len(got))] if got else [torch.empty(0)]


if __name__ == "__main__":  # `python -m eaglewire_testing.speculators_venv` pre-builds it
    print(ensure_speculators_venv())
