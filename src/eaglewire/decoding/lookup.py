"""Context lookup: a draft branch copied from earlier in the sequence, merged into the drafter's tree.

Why: greedy answers of small targets repeat themselves and their prompts
(lists, code, extraction), and a suffix match over the context predicts those
runs for free, often several tokens at once, exactly where a one-layer
drafter trained on little data is weakest. The branch is merged into the
EAGLE tree (shared prefixes are not duplicated), so one verify forward checks
both and the longest accepted path wins. Greedy only: lookup tokens are
deterministic, and the lossless sampling walk is defined for the drafter's
own sampled tree.
"""

from __future__ import annotations

from eaglewire.decoding.tree import DraftTree


def propose(context: list[int], max_tokens: int, max_ngram: int = 4, min_ngram: int = 2) -> list[int]:
    """Continuation of the latest earlier occurrence of the longest suffix n-gram (n from max to min)."""
    n_ctx = len(context)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        suffix = context[n_ctx - n:]
        for j in range(n_ctx - n - 1, -1, -1):  # latest match first, never the suffix itself
            if context[j:j + n] == suffix:
                return context[j + n:j + n + max_tokens]
    return []


def merge_branch(tree: DraftTree, tokens: list[int]) -> int:
    """Add ``tokens`` as a path from the root, reusing nodes already in the tree; returns nodes added.

    New nodes are appended after all existing ones (parents still precede
    children) with ``probs = None`` (chosen deterministically).
    """
    children = tree.children()
    cur, added = 0, 0
    for tok in tokens:
        nxt = next((c for c in children[cur] if tree.tokens[c - 1] == tok), None) if cur < len(children) else None
        if nxt is None:
            tree.tokens.append(tok)
            tree.parents.append(cur)
            tree.probs.append(None)
            nxt = len(tree.tokens)
            added += 1
        cur = nxt
    return added
