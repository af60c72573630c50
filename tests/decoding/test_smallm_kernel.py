"""The thin-matrix CPU kernel: equal to F.linear to float rounding, and greedy decoding through it
equals transformers' generate on every tiny architecture (every linear of the target routed through it)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import eaglewire.targets.smallm as smallm
from conftest import ARCHS, PROMPTS, greedy_reference, random_drafter
from eaglewire.decoding import target_runner
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.targets.fastlinear import FastLinear, packed_linears
from eaglewire.targets.points import eagle3_default


@pytest.fixture(scope="module")
def kernel():
    why = smallm.unavailable_reason()
    if why is not None:
        if os.environ.get("CI") == "true" and "EAGLEWIRE_KERNELS" not in os.environ:
            pytest.fail(f"CI machine cannot build the kernel: {why}")
        pytest.skip(why)
    mod = smallm.smallm_kernel()
    assert mod is not None, smallm._STATE.get("why")  # buildable here: it must build and pass its self-check
    return mod


@pytest.mark.parametrize("m", range(1, smallm.MAX_ROWS + 1))
@pytest.mark.parametrize("n,k", [(1, 8), (7, 13), (64, 576), (33, 1536), (97, 100)])
def test_kernel_equals_f_linear(kernel, m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (None, b):
        torch.testing.assert_close(kernel.linear(x, w, bias), F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
        # bf16 weights (the drafter's, decoding/draft_lean.py): the sums of the same widened values
        wb = w.bfloat16()
        torch.testing.assert_close(kernel.linear(x, wb, bias), F.linear(x, wb.float(), bias), rtol=1e-5, atol=1e-4)
        # int8 rows with their scale: the matrix they stand for, rebuilt here from the stored bytes
        wq = smallm.quantize_rows(w)
        q, scale = wq[:, :k].float(), torch.frombuffer(bytearray(wq[:, k:].numpy().tobytes()), dtype=torch.float32)
        assert wq.dtype == torch.int8 and wq.shape == (n, k + 4) and q.abs().max() == 127
        torch.testing.assert_close(kernel.linear(x, wq, bias), F.linear(x, q * scale[:, None], bias),
                                   rtol=1e-5, atol=1e-4)


def test_kernel_uses_every_thread_count(kernel):
    """Output rows are split over torch's intra-op threads; the result must not depend on the split."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 576, generator=g), torch.randn(1000, 576, generator=g)
    before = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(kernel.linear(x, w, None))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # each row's sum is done by one thread, in one order


def test_fastlinear_routes_rows_to_the_kernel_and_the_rest_elsewhere(kernel):
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    fl = FastLinear(w, b)
    assert fl.kernel is kernel
    for rows in (1, 4, 8, 9, 16, 17, 40, 100):  # 17+ rows go to oneDNN / MKL
        x = torch.randn(rows, 64, generator=g)
        torch.testing.assert_close(fl(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    assert fl(torch.randn(2, 3, 64)).shape == (2, 3, 300)
    # an int8-row weight: the kernel for 1..16 rows, its widened matrix elsewhere; same results either way
    fq = FastLinear(smallm.quantize_rows(w), b, pack=False)
    assert fq.kernel is kernel and fq.in_features == 64
    for rows in (1, 16, 17, 40):
        x = torch.randn(rows, 64, generator=g)
        torch.testing.assert_close(fq(x), F.linear(x, smallm.widened(fq.weight), b), rtol=1e-5, atol=1e-4)


def test_disabled_kernel_leaves_the_fallback(tmp_path):
    """EAGLEWIRE_KERNELS=0 (and, the same way, a machine with no compiler) keeps the oneDNN path."""
    code = ("import torch; from eaglewire.targets import smallm; from eaglewire.targets.fastlinear import FastLinear;"
            "assert smallm.smallm_kernel() is None; w = torch.randn(8, 4); fl = FastLinear(w);"
            "x = torch.randn(3, 4); assert torch.allclose(fl(x), x @ w.T, atol=1e-5); print(smallm._STATE['why'])")
    env = {**os.environ, "EAGLEWIRE_KERNELS": "0", "EAGLEWIRE_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "EAGLEWIRE_KERNELS=0" in r.stdout and not (tmp_path / "kernels").exists()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_exact_with_every_linear_through_the_kernel(kernel, tiny_targets, arch, monkeypatch):
    """Tiny targets' matrices are below the kernel's size threshold: lower it so every linear takes the kernel."""
    monkeypatch.setattr(target_runner, "packed_linears", functools.partial(packed_linears, kernel_numel=1))
    t = tiny_targets[arch]
    eng = SpecEngine(t, random_drafter(t), eagle3_default(t.num_layers))
    calls = []
    real = kernel.linear
    monkeypatch.setattr(kernel, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a), raising=False)
    for p in PROMPTS[:2]:
        ids = eng.encode(p)
        ref = greedy_reference(t, ids, 20)
        for mode in ("plain", "chain", "tree"):
            assert eng.generate(ids, SpecConfig(mode=mode, max_new_tokens=20, min_prob=0.0)).token_ids == ref, (mode, p)
    assert calls and max(calls) > 1 and min(calls) == 1  # decode and verify rows both went through it
