"""Drafting with an EAGLE-3 drafter: its own KV cache, chain and EAGLE-2 tree drafts.

What the drafter was trained to do (drafter/ttt.py): at position t it sees
the TARGET features f[t] and token x[t+1] and predicts x[t+2]; at draft step
k>0 it is fed its own previous hidden output instead of features, with rope
position t+k, attending to the step-0 keys of positions <= t plus the keys
of its own earlier steps at t.

Decoding reproduces exactly that. With committed tokens x[0..n-1] the target
has produced features for x[0..n-2] (the last token, the bonus, is not
verified yet). The drafter's REAL cache holds one entry per t = 0..n-2, each
computed from (f[t], x[t+1]); :meth:`DraftRunner.extend` appends the entries
of newly accepted tokens after each verify, from the target's features of the
accepted tokens only. Draft steps then run from the last real hidden output;
their KV is written after the real entries and overwritten by the next
extend, so no drafter entry of a committed position is ever based on
drafted features.
"""

from __future__ import annotations

import math

import torch

from eaglewire.decoding.draft_lean import DraftCache, LeanDraft, narrowed
from eaglewire.decoding.tree import DraftTree
from eaglewire.drafter.model import KV, Eagle3Drafter
from eaglewire.targets.fastlinear import FastLinear, packed_linears
from eaglewire.targets.smallm import MAX_ROWS

# llama.cpp's EAGLE-3 draft sampler keeps the 10 best draft logits (top-k 10, then a softmax over them) and stops
# drafting when the best one's probability is below --spec-draft-p-min (common/speculative.cpp, llama.cpp as
# vendored in llama-cpp-python 0.3.36); tests/engines/test_llama_server.py runs that server against this rule.
STEP_GATE_TOP_K = 10
GATES = ("path", "step")


def step_confidence(logits: torch.Tensor, k: int = STEP_GATE_TOP_K) -> float:
    """The best draft's probability renormalized over the ``k`` best logits: what llama.cpp gates each step on."""
    top = logits.float().topk(min(k, logits.shape[-1])).values  # [k], best first
    return float(torch.softmax(top, -1)[0])


class DraftRunner:
    """Drafter state for one sequence: real KV for positions 0..length-1 and the last hidden.

    The KV lives in growing buffers (:class:`DraftCache`): a round's draft
    entries are written after the real ones and simply overwritten by the
    next :meth:`extend`. Where the thin-matrix kernel was built, each drafter
    layer is one C++ call (:class:`LeanDraft`); else the model's own
    :meth:`Eagle3Drafter.step` runs on views of the same buffers.
    """

    def __init__(self, drafter: Eagle3Drafter, fast: bool = True, weights: str = "fp32"):
        self.drafter, self.fast = drafter, fast
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.draft_ids = drafter.draft_target_ids()  # [Dv] target id of each draft id
        self.lean = LeanDraft.build(drafter, weights) if fast else None
        # bf16 where the one-call layers run (draft_lean.py says why); elsewhere the drafter as it is
        self.weights = weights if self.lean is not None else str(p.dtype).removeprefix("torch.").replace("float32", "fp32")
        # the draft head is small next to the target's but still the drafter's largest matmul
        if self.weights != "fp32":  # the projection too: its 4 MB (fp32) are read from memory after every verify
            self.head = FastLinear(narrowed(drafter.lm_head.weight, self.weights), pack=False)
            self.fc = FastLinear(narrowed(drafter.fc.weight, self.weights), None if drafter.fc.bias is None
                                 else drafter.fc.bias.float(), pack=False)
        else:
            self.head = FastLinear(drafter.lm_head.weight) if fast else drafter.lm_head
            self.fc = None  # the model's fc (packed for 2..64 rows where fast)
        self.cache = DraftCache(drafter)
        self.reset()

    def reset(self) -> None:
        self.length = 0  # real entries = committed tokens - 1
        self.last: torch.Tensor | None = None  # [1, 1, H] hidden output at position length-1

    def real_kv(self) -> list[KV] | None:
        """Per layer, the keys and values of the real entries ``[1, Hk, length, D]`` (views)."""
        return self.cache.past(self.length)

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, used: int,
             blocked: torch.Tensor | None) -> torch.Tensor:
        """The drafter's layers on T new tokens after ``used`` cached rows; their K/V are written at rows
        used..used+T. ids [1, T]; hidden [1, T, H]; pos [T]; blocked bool [T, used+T], True = may not attend
        (None: every cached key, causal among the new ones). Returns the fed-back hidden [1, T, H]."""
        t = ids.shape[1]
        self.cache.room(used + t)
        if blocked is None and t > 1:
            blocked = torch.ones(t, used + t, dtype=torch.bool, device=self.device).triu_(used + 1)
        if self.lean is not None and t <= MAX_ROWS:  # a prompt's extend takes the model's step below
            return self.lean.step(ids, hidden, pos, self.cache, used, blocked)
        mask = (torch.ones(t, used + t, dtype=torch.bool, device=self.device) if blocked is None
                else ~blocked)[None, None]  # [1, 1, T, used+T], True = may attend
        with packed_linears(self.drafter, self.fast):
            out, new = self.drafter.step(ids, hidden, pos[None], self.cache.past(used), mask)
        self.cache.write(used, new)
        return out

    @torch.inference_mode()
    def extend(self, next_tokens: torch.Tensor, feats: torch.Tensor) -> None:
        """Append real entries: ``next_tokens[:, i]`` = x[t+1] for features ``feats[:, i]`` = f[t].

        next_tokens: [1, T] target ids; feats: [1, T, A*Ht] target features. Where the one-call layers
        run, a prompt's extend (T > MAX_ROWS) goes through them in MAX_ROWS-row chunks, as the target's
        prefill does (decoding/target_runner.py says why), with the weights every draft step uses.
        """
        t = next_tokens.shape[1]
        rows = MAX_ROWS if self.lean is not None else max(t, 1)
        for i in range(0, t, rows):
            self._extend(next_tokens[:, i : i + rows], feats[:, i : i + rows])

    def _extend(self, next_tokens: torch.Tensor, feats: torch.Tensor) -> None:
        t = next_tokens.shape[1]
        if self.fc is not None:  # narrowed weights: the one-call layers run (lean), so T <= MAX_ROWS here
            hidden = self.fc(self.drafter.fc_input(feats.to(self.dtype)))  # [1, T, H]
        else:
            with packed_linears(self.drafter.fc, self.fast):
                hidden = self.drafter.project(feats.to(self.dtype))  # [1, T, H]
        pos = torch.arange(self.length, self.length + t, device=self.device)  # [T]
        out = self._run(next_tokens.to(self.device), hidden, pos, self.length, None)
        self.length += t
        self.last = out[:, -1:]  # [1, 1, H]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.drafter.head_input(hidden, None if self.lean is None else self.lean.norm)
        return self.head(x).float()  # [..., Dv], = drafter.logits

    def _step(self, tokens: list[int], hidden: torch.Tensor, pos: int, cols: int,
              tree_cols: list[list[bool]] | None) -> torch.Tensor:
        """Draft step for k nodes at one depth after ``cols`` draft entries of this round.
        tree_cols: per node, which of those entries and the k new ones it may attend to ([k][cols+k]); None:
        every one of them (a chain's single node)."""
        k = len(tokens)
        ids = torch.tensor([tokens], device=self.device)  # [1, k]
        blocked = None
        if tree_cols is not None:
            blocked = torch.zeros(k, self.length + cols + k, dtype=torch.bool)  # every real entry visible
            blocked[:, self.length:] = ~torch.tensor(tree_cols, dtype=torch.bool)  # [k, cols+k]
            blocked = blocked.to(self.device)
        return self._run(ids, hidden, torch.full((k,), pos, device=self.device), self.length + cols, blocked)

    @torch.inference_mode()
    def chain(self, root: int, depth: int, sample=None, min_prob: float = 0.0, gate: str = "path") -> DraftTree:
        """A chain of up to ``depth`` drafts. ``sample(logits [Dv]) -> (draft id, probs [Dv])`` or None = argmax.

        The chain stops before a draft that fails the ``min_prob`` gate: it
        would rarely be accepted and still widen the verify. ``gate`` "path"
        compares the cumulative draft probability (product along the chain);
        "step" compares each step's own top draft probability among its
        :data:`STEP_GATE_TOP_K` best (:func:`step_confidence`), the rule
        llama.cpp drafts by, so a gated llama-server can be predicted. Either
        stop depends on the draft distribution only, so sampling stays lossless.
        """
        tree = DraftTree(root=root)
        h = self.last
        cum = 1.0
        for step in range(depth):
            logits = self._logits(h)[0, -1]  # [Dv]
            if sample is None:
                ix, p, probs = int(logits.argmax()), None, None
            else:
                ix, p = sample(logits)
                probs = self._to_target_vocab(p)
            if min_prob > 0:
                if gate == "step":
                    conf = step_confidence(logits)
                else:
                    cum *= float((logits.softmax(-1) if p is None else p)[ix])
                    conf = cum
                if conf < min_prob:
                    break
            tok = int(self.draft_ids[ix])
            tree.tokens.append(tok)
            tree.parents.append(step)
            tree.probs.append(probs)
            if step == depth - 1:
                break
            h = self._step([tok], h, self.length + step, step, None)
        return tree

    def _to_target_vocab(self, p: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(self.drafter.config.vocab_size, device=p.device)
        return full.index_copy_(0, self.draft_ids, p.float())  # [V]

    @torch.inference_mode()
    def tree(self, root: int, top_k: int, depth: int, total_tokens: int, min_prob: float = 0.0) -> DraftTree:
        """EAGLE-2 dynamic tree: expand the top_k best frontier nodes per level, rerank globally.

        Scores are cumulative draft log-probs. Every expanded node adds its
        top_k children as candidates; the frontier of the next level is the
        top_k candidates by score. Finally the ``total_tokens - 1`` best
        candidates are kept; a child never outscores its parent and the sort
        is stable (parents are inserted first), so the kept set is closed
        under ancestors and parents precede children.

        ``min_prob`` > 0 also drops candidates whose cumulative draft
        probability is below it, and stops expanding once no frontier node
        reaches it: where verifying costs more than a decode step (CPU), a node
        the drafter itself gives a few percent is a net loss, and a round in
        which nothing reaches the threshold verifies the root alone (a plain
        step that still feeds the drafter). Still closed under ancestors,
        since a child never outscores its parent.
        """
        k = min(top_k, self.draft_ids.numel())
        logp = self._logits(self.last)[0, -1].log_softmax(-1)  # [Dv]
        s, ix = logp.topk(k)
        toks = self.draft_ids[ix].tolist()
        scores, parents, anc = s.tolist(), [-1] * k, [[i] for i in range(k)]
        frontier = list(range(k))
        hidden = self.last.expand(1, k, -1)  # [1, k, H]
        cols, kv_col = 0, {}
        floor = math.log(min_prob) if min_prob > 0 else -math.inf
        for level in range(2, depth + 1):
            if max(scores[f] for f in frontier) < floor:
                break
            m = [[False] * (cols + k) for _ in range(k)]  # [k][cols+k]: ancestors' entries and its own
            for j, f in enumerate(frontier):
                for a in anc[f][:-1]:
                    m[j][kv_col[a]] = True
                m[j][cols + j] = True
                kv_col[f] = cols + j
            out = self._step([toks[f] for f in frontier], hidden, self.length + level - 2, cols, m)
            cols += k
            cs, ci = self._logits(out)[0].log_softmax(-1).topk(k, dim=-1)  # [k, k]
            cum = torch.tensor([scores[f] for f in frontier], device=cs.device)[:, None] + cs  # [k, k]
            first = len(toks)
            flat_par = [frontier[r] for r in range(k) for _ in range(k)]
            toks += self.draft_ids[ci.flatten()].tolist()
            scores += cum.flatten().tolist()
            parents += flat_par
            anc += [anc[p] + [first + i] for i, p in enumerate(flat_par)]
            best = cum.flatten().topk(k).indices  # [k] indices into the k*k block
            frontier = [first + int(b) for b in best]
            hidden = out[:, best // k]  # [1, k, H]: each new frontier node's parent output
        return _select(toks, parents, scores, root, total_tokens - 1, floor)


def _select(toks: list[int], parents: list[int], scores: list[float], root: int, n: int,
            floor: float = -math.inf) -> DraftTree:
    """Keep the n best candidates (stable sort by score) scoring at least ``floor`` as a DraftTree."""
    order = [i for i in sorted(range(len(toks)), key=lambda i: -scores[i])[:n] if scores[i] >= floor]
    index = {c: i + 1 for i, c in enumerate(order)}
    tree = DraftTree(root=root)
    for c in order:
        tree.tokens.append(toks[c])
        tree.parents.append(0 if parents[c] < 0 else index[parents[c]])
        tree.probs.append(None)
    return tree
