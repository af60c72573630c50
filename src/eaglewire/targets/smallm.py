"""A thin-matrix fp32 kernel for CPU verify steps, built once and cached.

WHY: a speculative verify multiplies 2..16 rows by every weight of the target.
At those row counts MKL and oneDNN either run on one core or re-read each
weight per row, so on a 2-core machine a 4-token verify cost 1.6x a plain
decode step while the memory traffic (the weights, read once) is the same.
``kernels/smallm.cpp`` streams each weight once for all rows and splits the
output rows over torch's intra-op threads, as the 1-row path already is.

It is compiled on first use with torch's own extension machinery into the
eaglewire cache, keyed by the source, the torch version and the CPU
capability, and checked against ``F.linear`` before it is used. A cached
build is loaded only when it matches the record (`infra/buildcache.py`)
written after its build passed that check: a `.so` cut short by a full disk or
a killed build is rebuilt, never mapped (that was a SIGBUS with no message). Without a
compiler, on a CPU without AVX2, on anything but fp32 CPU tensors, or with
``EAGLEWIRE_KERNELS=0``, :func:`smallm_kernel` returns None and callers keep
the oneDNN / MKL path: nothing depends on the compiler being there.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglewire.infra.buildcache import damage, seal
from eaglewire.infra.locks import waiting_lock
from eaglewire.targets.load import cache_dir

MAX_ROWS = 16  # the kernel's row counts: 1..MAX_ROWS (a tree of 7 plus a lookup branch of 6 fits)
SOURCE = Path(__file__).resolve().parent / "kernels" / "smallm.cpp"
SOURCES = (SOURCE, SOURCE.parent / "lean_layer.cpp")  # the products, and one decoder layer around them
_STATE: dict[str, object] = {}
# compiler flags per torch CPU capability (part of the cache key): AVX-512 CPUs also get its wider registers
# for the 7..16-row products (kernels/smallm.cpp says where they pay)
ISA_FLAGS = {"AVX2": ["-mavx2", "-mfma"],
             "AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]}


def _capability() -> str:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # a torch without the query: treat as unknown
        return "unknown"


def unavailable_reason() -> str | None:
    """Why the kernel cannot be built here (None: it can be tried)."""
    if os.environ.get("EAGLEWIRE_KERNELS", "1") == "0":
        return "disabled by EAGLEWIRE_KERNELS=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if _capability() not in ("AVX2", "AVX512"):
        return f"CPU capability {_capability()} (AVX2 needed)"
    missing = [p for p in SOURCES if not p.is_file()]
    if missing:
        return f"{missing[0]} missing"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler on PATH"
    return None


def kernel_key() -> str:
    h = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES))
    h.update(f"{torch.__version__}|{_capability()}|{sys.version_info[:2]}".encode())
    return h.hexdigest()[:12]


def _build():
    """(the kernel module, why its self-check failed or None): loaded from the cache when its record says the cached
    build is whole, else (re)built; the record is written only once a build has loaded and run."""
    key = kernel_key()
    build = cache_dir() / "kernels" / f"smallm-{key}"
    build.mkdir(parents=True, exist_ok=True)
    name = f"eaglewire_smallm_{key}"
    with waiting_lock(build.parent / f".smallm-{key}.lock"):  # one builder; a killed one's flock goes with it
        cached = any(build.glob(f"{name}*.so"))
        if cached and (why := damage(build)) is not None:
            print(f"[kernels] the cached kernel in {build} is not used ({why}); rebuilding it (~1 min)",
                  file=sys.stderr)
            shutil.rmtree(build)  # objects and ninja's records too: ninja would call a cut-short .so up to date
            build.mkdir(parents=True)
        (build / "lock").unlink(missing_ok=True)  # torch's own build lock, left by a killed build: we hold ours
        mod = _load(build, name, announce=not cached)
        why = _self_check(mod)
        if damage(build) is not None:  # it loaded and ran: whole (a failed self-check falls back on every load)
            seal(build, [Path(mod.__file__)])
    return mod, why


def _load(build: Path, name: str, announce: bool = True):
    from torch.utils.cpp_extension import load  # imports setuptools: only when a kernel is wanted

    fresh = not any(build.glob(f"{name}*.so"))
    if fresh and announce:
        print(f"[kernels] building the thin-matrix CPU kernel once (~1 min) into {build}", file=sys.stderr)
    t0 = time.perf_counter()
    path = os.environ.get("PATH", "")
    # the pinned `ninja` wheel puts its binary beside this Python, which is not on PATH in an unactivated venv
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = load(name=name, sources=[str(p) for p in SOURCES], build_directory=str(build), verbose=False,
                       extra_cflags=["-O3", *ISA_FLAGS[_capability()], "-fopenmp"], extra_ldflags=["-fopenmp"])
    finally:
        os.environ["PATH"] = path
    if fresh:
        print(f"[kernels] built in {time.perf_counter() - t0:.0f} s (cached for this torch and CPU)", file=sys.stderr)
    return mod


def _self_check(mod) -> str | None:
    g = torch.Generator().manual_seed(0)
    for m, n, k in ((1, 67, 29), (3, 64, 576), (8, 33, 100), (13, 70, 64), (16, 9, 24), (9, 37, 1543)):
        x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g))
        for bias in (None, b):
            # bf16 weights are widened exactly (the same sums as fp32 of them); int8 rows sum, then scale
            for wt in (w, w.bfloat16(), quantize_rows(w)):
                got, want = mod.linear(x, wt, bias), F.linear(x, widened(wt), bias)
                if not torch.allclose(got, want, rtol=1e-5, atol=1e-4):
                    return (f"self-check failed at M={m}, N={n}, K={k}, {wt.dtype} weights "
                            f"(max diff {(got - want).abs().max():.3g})")
    return None


def smallm_kernel():
    """The loaded kernel module (``.linear(x [M, K], w [N, K], bias)``), or None; decided once per process."""
    if "mod" in _STATE:
        return _STATE["mod"]
    mod, why = None, unavailable_reason()
    if why is None:
        try:
            mod, why = _build()
        except Exception as e:  # no toolchain, a failed compile: the oneDNN path stays
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        if why:
            print(f"[kernels] thin-matrix kernel not used ({why}); verify falls back to oneDNN", file=sys.stderr)
            mod = None
    _STATE["mod"], _STATE["why"] = mod, why
    return mod


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes this call: fp32 CPU rows, fp32, bf16 or int8-row weights, 1..MAX_ROWS rows."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype in WEIGHT_DTYPES
            and 1 <= x.shape[0] <= MAX_ROWS)


# The kernel's int8 format: each output row's K values as int8, then that row's fp32 scale (4 bytes), one
# tensor [N, K + 4]. Symmetric per row (the row's largest magnitude maps to 127): a drafter's matrices at a
# quarter of their fp32 bytes, for drafting only (decoding/draft_lean.py); products still sum in fp32.
SCALE_BYTES = 4
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.int8)


def quantize_rows(w: torch.Tensor) -> torch.Tensor:
    """int8 rows with their scale ``[N, K + 4]`` for a float matrix ``[N, K]``."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127  # [N, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)  # [N, K]
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=1).contiguous()  # [N, K + 4]


def in_features(w: torch.Tensor) -> int:
    """K of a weight in any of the kernel's formats."""
    return w.shape[1] - (SCALE_BYTES if w.dtype == torch.int8 else 0)


def widened(w: torch.Tensor) -> torch.Tensor:
    """The fp32 matrix ``[N, K]`` a weight in any of the kernel's formats stands for (exact for bf16)."""
    if w.dtype != torch.int8:
        return w.float()
    k = in_features(w)
    return w[:, :k].float() * w[:, k:].contiguous().view(torch.float32)  # [N, K] * [N, 1]
