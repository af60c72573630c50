"""Draft trees: node layout, ancestor masks, position ids.

Layout used everywhere (drafting, verification, KV compaction): index 0 is
the ROOT, the last committed token whose target features are not known yet
(the previous round's bonus token); nodes 1..N are draft tokens ordered so
that every parent precedes its children. A chain is a tree in which node i's
parent is i-1.

Why the ancestor mask: in one target forward every draft token must see the
committed prefix plus exactly its own ancestors, as if the path it lies on
had been decoded alone; with the position id = prefix length + depth, the
hidden state (and so the logits) of each node equals what sequential decoding
of its path would produce.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """Draft tokens as a tree rooted at the last committed token.

    ``probs[i]`` is the draft distribution (target vocab, fp32 [V]) node i+1
    was SAMPLED from, or None when the node was chosen deterministically
    (top-k); the acceptance rule differs (see verify.py).
    """

    root: int  # target id of the root token
    tokens: list[int] = field(default_factory=list)  # target ids of nodes 1..N
    parents: list[int] = field(default_factory=list)  # parent index (0 = root) of nodes 1..N
    probs: list[torch.Tensor | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def all_tokens(self) -> list[int]:
        return [self.root, *self.tokens]

    def depths(self) -> list[int]:
        """Depth of every index 0..N (root 0)."""
        d = [0]
        for p in self.parents:
            d.append(d[p] + 1)
        return d

    def children(self) -> list[list[int]]:
        """Children indices of every index 0..N, in node order (best first)."""
        ch: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents, start=1):
            ch[p].append(i)
        return ch

    def is_chain(self) -> bool:
        return self.parents == list(range(len(self.parents)))

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """bool [N+1, N+1]: row i may attend to column j iff j is i or an ancestor of i."""
        n = len(self.tokens) + 1
        m = torch.zeros(n, n, dtype=torch.bool)
        m[0, 0] = True
        for i, p in enumerate(self.parents, start=1):
            m[i] = m[p]
            m[i, i] = True
        return m.to(device)

    def position_ids(self, start: int, device=None) -> torch.Tensor:
        """[1, N+1]: root at ``start``, a node at depth d at ``start + d``."""
        return (torch.tensor(self.depths(), device=device) + start)[None]

    def main_path(self) -> list[int]:
        """Root + first-child chain: the path most likely accepted (logits prefetched for it)."""
        ch = self.children()
        path, cur = [0], 0
        while ch[cur]:
            cur = ch[cur][0]
            path.append(cur)
        return path

    def prefetch(self, rows: int) -> list[int]:
        """The main path, then the other nodes nearest the root, up to ``rows`` indices: the rows whose
        target logits one head call computes before the walk. Why: on a CPU the head streams its whole
        weight per call, so up to ~6 rows cost what one does, while a sibling the walk accepts outside the
        main path cost a second call (72 of 331 rounds of the quick drafter's tree + lookup)."""
        path = self.main_path()
        if len(path) >= rows:
            return path
        seen, depth = set(path), self.depths()
        rest = sorted((i for i in range(1, len(self.tokens) + 1) if i not in seen), key=depth.__getitem__)
        return path + rest[: rows - len(path)]

