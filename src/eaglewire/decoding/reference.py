"""Greedy chain speculative decoding in one loop: read this first, then engine.py.

Why it exists: a speculative round in the engine spans several files (the
target's KV cache and lean kernels, the drafter's cache and its rollback, trees,
sampling, metrics). This is the same round with all of that taken out (after
gpt-fast's `speculative_decode`): every round runs the target and the drafter
over the whole sequence, so nothing is cached and nothing rolled back. It is
slow on purpose, and it is the engine's oracle: the engine's tests require the
same tokens and the same accepted count in every round (tests/decoding).

One round, for committed tokens x[0..n-1] (prompt, then generated; the last
was chosen by the target) and the target's features f[0..n-2] of them:
  1. draft: the drafter reads row j = (token x[j+1], feature f[j]); its output
     at the last row gives draft d1; then (d1, that output) is a new row, which
     gives d2, and so on to `depth` drafts (the drafter feeds itself back);
  2. verify: one target forward over x + drafts: its argmax after x[n-1] and after
     each draft says how many drafts it would have produced itself (accepted);
  3. commit the accepted drafts plus the target's own next token (the bonus).
"""

from __future__ import annotations

import torch

from eaglewire.drafter.model import causal_mask
from eaglewire.targets.capture import capturing


def _target(target, points, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """(the target's argmax after each position, its features [1, T, A*H] at `points`), one plain forward."""
    with capturing(target.model, points) as store:
        logits = target.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]  # [T, V]
    return logits.argmax(-1).tolist(), torch.cat([store[p.name] for p in points], -1)


def _drafts(drafter, ids: list[int], feats: torch.Tensor, depth: int) -> list[int]:
    """`depth` greedy drafts after `ids`; feats [1, len(ids) - 1, A*H] = the target's features of ids[:-1]."""
    hidden, tokens, out = drafter.project(feats), ids[1:], []
    for _ in range(depth):
        n = len(tokens)
        h, _ = drafter.step(torch.tensor([tokens]), hidden, torch.arange(n)[None], None, causal_mask(n))
        d = int(drafter.draft_to_target(drafter.logits(h[:, -1]).argmax(-1)))
        out, tokens, hidden = out + [d], tokens + [d], torch.cat([hidden, h[:, -1:]], 1)
    return out


@torch.no_grad()
def speculative_decode(target, drafter, points, prompt: list[int], max_new_tokens: int, depth: int,
                       eos: set[int] = frozenset()) -> tuple[list[int], list[int]]:
    """(generated tokens, drafts accepted in each round): greedy, chain, lossless (= the target's own greedy)."""
    best, feats = _target(target, points, prompt)
    out, accepted = [best[-1]], []  # the prefill's token
    while len(out) < max_new_tokens and out[-1] not in eos:
        ids = prompt + out
        drafts = _drafts(drafter, ids, feats[:, : len(ids) - 1], depth)
        best, feats = _target(target, points, ids + drafts)
        want = best[len(ids) - 1:]  # the target's token after x[n-1], after d1, ...
        a = 0
        while a < depth and drafts[a] == want[a]:
            a += 1
        new = drafts[:a] + [want[a]]
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))  # stop at an EOS
        new = new[: min(cut, max_new_tokens - len(out))]  # and at the budget
        out += new
        accepted.append(min(a, len(new)))
    return out, accepted
