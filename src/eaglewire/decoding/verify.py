"""Acceptance: walk the draft tree against the target's distributions.

Naming convention: ``p`` = DRAFT distribution, ``q`` = TARGET distribution
(after temperature / top-p warping, i.e. the distribution plain sampling
from the target would use).

Greedy: from the root, follow the child whose token equals argmax q at the
current node; the first mismatch (or a leaf) yields the bonus token argmax q.
The output is therefore exactly the target's greedy continuation.

Sampling (lossless, recursive rejection over siblings, as SpecInfer/EAGLE):
at the current node with residual target distribution q, try the children in
order. A child x drawn from p is accepted with probability min(1, q(x)/p(x));
on rejection q <- normalize(max(0, q - p)). A child chosen deterministically
(top-k tree) has p = one-hot(x), so it is accepted with probability q(x) and
on rejection x is removed from q. If no child is accepted the bonus token is
sampled from the final residual. Each emitted token is then distributed
exactly as q at its node: for one sibling this is the classic speculative
sampling identity, and after a rejection the residual is precisely the
target distribution conditioned on "not the rejected proposal", so the
argument repeats for the next sibling.

``logits_at(i)`` returns the target's fp32 logits [V] at tree index i; the
engine computes them lazily so the walk only pays for the rows it visits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from eaglewire.decoding.tree import DraftTree

LogitsAt = Callable[[int], torch.Tensor]


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities [..., V] after temperature and nucleus (top-p) filtering.

    Top-p keeps the smallest set of most-likely tokens whose mass reaches
    top_p (the most likely token is always kept), like transformers'
    TopPLogitsWarper up to ties.
    """
    probs = (logits.float() / max(temperature, 1e-6)).softmax(-1)
    if top_p >= 1.0:
        return probs
    sp, si = probs.sort(-1, descending=True)
    before = sp.cumsum(-1) - sp  # mass strictly before each sorted token
    sp = torch.where(before < top_p, sp, torch.zeros_like(sp))
    out = torch.zeros_like(probs).scatter_(-1, si, sp)
    return out / out.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


def walk_greedy(tree: DraftTree, logits_at: LogitsAt) -> tuple[list[int], int]:
    """(accepted node indices in path order, bonus token)."""
    children = tree.children()
    path, cur = [], 0
    while True:
        tok = int(logits_at(cur).argmax())
        nxt = next((c for c in children[cur] if tree.tokens[c - 1] == tok), None)
        if nxt is None:
            return path, tok
        path.append(nxt)
        cur = nxt


def _reject(q: torch.Tensor, x: int, p: torch.Tensor | None) -> torch.Tensor:
    """Residual after rejecting proposal x drawn from p (None = one-hot at x)."""
    if p is None:
        r = q.clone()
        r[x] = 0.0
    else:
        r = (q - p.to(q.device)).clamp_min(0.0)
    total = r.sum()
    # total == 0 only when q <= p everywhere, i.e. q == p: then rejection has probability 0
    return r / total if total > 0 else q


def walk_sample(tree: DraftTree, logits_at: LogitsAt, temperature: float, top_p: float,
                gen: torch.Generator | None) -> tuple[list[int], int]:
    """(accepted node indices in path order, bonus token) by recursive rejection sampling."""
    children = tree.children()
    path, cur = [], 0
    while True:
        q = warp(logits_at(cur), temperature, top_p)  # [V]
        accepted = None
        for c in children[cur]:
            x, p = tree.tokens[c - 1], tree.probs[c - 1]
            px = 1.0 if p is None else float(p[x])
            u = float(torch.rand((), generator=gen))
            if px > 0 and u < min(1.0, float(q[x]) / px):
                accepted = c
                break
            q = _reject(q, x, p)
        if accepted is None:
            return path, sample(q, gen)
        path.append(accepted)
        cur = accepted
