"""The drafter's causal attention kernels (drafter/attention.py) against their matmul reference."""

from __future__ import annotations

import pytest
import torch

from eaglewire.drafter import attention

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_attention_lse_grads(dtype):
    """CPU flash (out, lse) with the injected lse gradient == autograd of the matmul reference."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 37, 8, generator=g, dtype=dtype)
    k = torch.randn(2, 3, 37, 8, generator=g, dtype=dtype)
    v = torch.randn(2, 3, 37, 8, generator=g, dtype=dtype)
    d_out = torch.randn(2, 6, 37, 8, generator=g, dtype=dtype)
    d_lse = torch.randn(2, 6, 37, generator=g, dtype=dtype)
    res = []
    for fn in (attention.causal_attention_lse, attention.causal_attention_lse_matmul):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = fn(*xs, 8**-0.5)
        ((out * d_out).sum() + (lse * d_lse).sum()).backward()
        res.append([out, lse] + [x.grad for x in xs])
        # lse unused: the plain backward path
        xs2 = [x.clone().requires_grad_() for x in (q, k, v)]
        out2, _ = fn(*xs2, 8**-0.5)
        (out2 * d_out).sum().backward()
        res[-1] += [x.grad for x in xs2]
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, **tol)
