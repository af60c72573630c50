"""The decoding loop: prefill, draft, verify, accept, roll back, feed features forward.

One round with committed tokens x[0..n-1] (the target has KV and features
for x[0..n-2]; the drafter has real entries for t = 0..n-2, see draft.py):

1. draft: a chain or tree rooted at x[n-1] from the drafter's last real hidden;
2. verify: ONE target forward over [x[n-1], drafts] with the tree mask and
   tree positions, capturing features; logits only at the rows the
   acceptance walk visits (the most likely path is prefetched in one call);
3. accept: greedy or lossless sampling walk (verify.py) -> path + bonus;
4. roll back: the target cache keeps x[n-1] and the accepted path only;
5. feed forward: the drafter appends real entries for the root and the
   accepted nodes, from the target's features of exactly those tokens, with
   the next tokens (accepted path + bonus) as inputs.

Why the defaults (chain depth ``DEPTH``, 3, saved/depth.py; tree top_k 3, depth 2, 7 tokens; drafts the
drafter gives under 10% cumulative probability dropped): on a CPU without
AVX-512 a verify round costs more than a decode step and grows with its
width, and the drafters a CPU can train accept few tokens past depth 2, so a
short, wide tree is fastest (measured against deeper shapes on two
drafters), and a round whose drafts are all unlikely is cheaper as a plain
step. GPU shapes (60 tokens, depth 7-8) would cost several decode steps per
round here; there the threshold defaults to 0 (``MIN_PROB``). Figures and the commands that produce
them: ``benchmarks/README.md``; ``bench --auto-shape N`` picks a shape per
drafter.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from eaglewire.decoding.draft import GATES, DraftRunner
from eaglewire.decoding.lookup import merge_branch, propose
from eaglewire.decoding.metrics import Metrics, StepRecord
from eaglewire.decoding.shapes import DEFAULTS, MIN_PROB
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.decoding.verify import sample, walk_greedy, walk_sample, warp
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import encode, render

PREFETCH_ROWS = 6  # target logits computed in the verify's one head call (DraftTree.prefetch)


def default_min_prob(device) -> float:
    """The confidence threshold for drafts on ``device`` when none is given (see the module docstring)."""
    return MIN_PROB.get(torch.device(device).type, 0.0)


@dataclass
class SpecConfig:
    """How to decode. mode: plain (no drafter), chain, tree."""

    mode: str = "tree"
    depth: int = DEFAULTS["chain_depth"]  # chain length
    top_k: int = DEFAULTS["top_k"]
    tree_depth: int = DEFAULTS["tree_depth"]
    total_tokens: int = DEFAULTS["total_tokens"]  # root + drafts in one verify
    lookup: int = 0  # greedy: also verify up to this many tokens copied from the context (0 = off)
    min_prob: float | None = None  # drop drafts whose cumulative draft probability is below this; None = by device
    gate: str = "path"  # chain (a tree always gates its paths): path = cumulative, step = llama.cpp's rule
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    seed: int = 0

    def check(self) -> None:
        if self.mode not in ("plain", "chain", "tree"):
            raise EaglewireError(f"--mode {self.mode!r}: expected plain, chain or tree")
        if self.max_new_tokens < 1:
            raise EaglewireError(f"--max-new-tokens {self.max_new_tokens}: expected >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise EaglewireError("--temperature must be >= 0 and --top-p in (0, 1]")
        if min(self.depth, self.top_k, self.tree_depth) < 1 or self.total_tokens < 2:
            raise EaglewireError("depth, top_k, tree_depth must be >= 1 and total_tokens >= 2")
        if self.lookup < 0:
            raise EaglewireError(f"--lookup {self.lookup}: expected >= 0")
        if self.min_prob is not None and not 0 <= self.min_prob < 1:
            raise EaglewireError(f"--min-prob {self.min_prob}: expected a probability in [0, 1)")
        if self.gate not in GATES:
            raise EaglewireError(f"--gate {self.gate!r}: expected one of {', '.join(GATES)}")

    def resolved(self, device) -> SpecConfig:
        """This config with the device-dependent defaults filled in (what outputs record as used)."""
        if self.min_prob is not None:
            return self
        return dataclasses.replace(self, min_prob=default_min_prob(device))


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: Metrics

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                **self.metrics.to_dict()}


class _Output:
    """Committed generated tokens and the stop conditions (EOS, length, stop strings)."""

    def __init__(self, tokenizer, eos: list[int], budget: int, stops: list[str]):
        self.tok, self.eos, self.budget, self.stops = tokenizer, set(eos), budget, [s for s in stops if s]
        self.ids: list[int] = []
        self.reason: str | None = None

    @property
    def done(self) -> bool:
        return self.reason is not None

    def push(self, tokens: list[int]) -> int:
        """Commit tokens up to the first EOS / the budget; return how many were committed."""
        n = 0
        for t in tokens:
            self.ids.append(t)
            n += 1
            if t in self.eos:
                self.reason = "eos"
                break
            if len(self.ids) >= self.budget:
                self.reason = "length"
                break
        if not self.done and self.stops and self._stop_at() is not None:
            self.reason = "stop_string"
        return n

    def _stop_at(self) -> int | None:
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        found = [text.find(s) for s in self.stops if s in text]
        return min(found) if found else None

    def finish(self) -> tuple[list[int], str, int]:
        """(token ids, text, tokens trimmed): a stop string and what follows it are removed."""
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if self.reason != "stop_string":
            return self.ids, text, 0
        cut = self._stop_at()
        k = next(i for i in range(1, len(self.ids) + 1)
                 if any(s in self.tok.decode(self.ids[:i], skip_special_tokens=True) for s in self.stops))
        return self.ids[:k], text[:cut], len(self.ids) - k


class _RowLogits:
    """Target logits at tree indices, computed on demand (prefetched rows in one head call)."""

    def __init__(self, runner: TargetRunner, hidden: torch.Tensor, prefetch: list[int]):
        self.runner, self.hidden = runner, hidden[0]  # [N, H]
        z = runner.logits(self.hidden[prefetch])  # [len(prefetch), V]
        self.rows = {i: z[j] for j, i in enumerate(prefetch)}

    def __call__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = self.runner.logits(self.hidden[i : i + 1])[0]
        return self.rows[i]


class SpecEngine:
    """Speculative (or plain) decoding of one request at a time on a target."""

    def __init__(self, target, drafter=None, points=None, fast: bool = True, draft_weights: str = "fp32"):
        if drafter is not None and not points:
            raise EaglewireError("a drafter needs its capture points (provenance 'points.names')")
        self.target = target
        self.runner = TargetRunner(target, points if drafter is not None else None, fast=fast)
        self.draft = DraftRunner(drafter, fast=fast, weights=draft_weights) if drafter is not None else None

    # ------------------------------------------------------------ prompts
    def encode(self, prompt, chat: bool = True) -> list[int]:
        """Token ids of a prompt (str or list of messages), chat template applied by default."""
        tok = self.target.tokenizer
        if isinstance(prompt, str) and not prompt.strip():
            raise EaglewireError("prompt is empty (expected some text)")
        if chat:
            msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            ids = encode(tok, render(tok, msgs, add_generation_prompt=True))
        else:
            ids = list(tok(prompt)["input_ids"])
        if not ids:
            raise EaglewireError("prompt tokenizes to no tokens")
        return ids

    # ------------------------------------------------------------ decoding
    def generate(self, prompt_ids: list[int], cfg: SpecConfig) -> Result:
        cfg.check()
        cfg = cfg.resolved(self.target.device)
        if cfg.mode != "plain" and self.draft is None:
            raise EaglewireError(f"mode {cfg.mode!r} needs a drafter (give --drafter, or use plain decoding)")
        limit = self.runner.max_positions
        if not prompt_ids:
            raise EaglewireError("prompt is empty (expected at least one token)")
        if len(prompt_ids) >= limit:
            raise EaglewireError(f"prompt has {len(prompt_ids)} tokens; the target's context is {limit} positions")
        gen = torch.Generator().manual_seed(cfg.seed)
        m = Metrics(prompt_tokens=len(prompt_ids))
        out = _Output(self.target.tokenizer, self.target.eos_ids(), min(cfg.max_new_tokens, limit - len(prompt_ids)), cfg.stop)
        start = time.perf_counter()
        self._prompt = list(prompt_ids)
        self._prefill(prompt_ids, cfg, gen, out, m)
        depth = max(cfg.depth if cfg.mode == "chain" else cfg.tree_depth, self._lookup_len(cfg))
        while not out.done:
            if cfg.mode != "plain" and self.runner.length + depth + 2 <= limit:
                self._spec_step(cfg, gen, out, m)
            else:
                self._plain_step(cfg, gen, out, m)
        ids, text, trimmed = out.finish()
        m.stop_trimmed, m.generated = trimmed, len(ids)
        m.time["total"] = time.perf_counter() - start
        m.time["other"] = m.time["total"] - m.time["prefill"] - m.time["draft"] - m.time["verify"]
        return Result(ids, text, out.reason, m)

    def _choose(self, logits: torch.Tensor, cfg: SpecConfig, gen) -> int:
        if cfg.temperature == 0:
            return int(logits.argmax())
        return sample(warp(logits, cfg.temperature, cfg.top_p), gen)

    def _prefill(self, ids: list[int], cfg: SpecConfig, gen, out: _Output, m: Metrics) -> None:
        t0 = time.perf_counter()
        self.runner.reset()
        x = torch.tensor([ids], device=self.target.device)  # [1, T]
        hidden, feats = self.runner.forward(x)
        tok = self._choose(self.runner.logits(hidden[0, -1:])[0], cfg, gen)
        m.prefill_tokens = out.push([tok])
        t1 = time.perf_counter()
        m.time["prefill"] += t1 - t0
        if self.draft is not None and cfg.mode != "plain" and not out.done:
            self.draft.reset()
            nxt = torch.tensor([ids[1:] + [tok]], device=self.target.device)  # [1, T]: x[t+1]
            self.draft.extend(nxt, feats)
            m.time["draft"] += time.perf_counter() - t1

    def _plain_step(self, cfg: SpecConfig, gen, out: _Output, m: Metrics) -> None:
        t0 = time.perf_counter()
        hidden, _ = self.runner.forward(torch.tensor([[out.ids[-1]]], device=self.target.device))
        out.push([self._choose(self.runner.logits(hidden[0, -1:])[0], cfg, gen)])
        m.time["verify"] += time.perf_counter() - t0

    @staticmethod
    def _lookup_len(cfg: SpecConfig) -> int:
        return cfg.lookup if cfg.temperature == 0 and cfg.mode != "plain" else 0

    def _make_draft(self, cfg: SpecConfig, committed: list[int], gen):
        """Draft rooted at the last committed token; ``committed`` = generated ids so far."""
        root = committed[-1]
        if cfg.mode == "tree":
            tree = self.draft.tree(root, cfg.top_k, cfg.tree_depth, cfg.total_tokens, cfg.min_prob)
            if self._lookup_len(cfg):
                merge_branch(tree, propose(self._prompt + committed, self._lookup_len(cfg)))
            return tree
        sampler = None
        if cfg.temperature > 0:
            def sampler(logits):
                p = warp(logits, cfg.temperature, cfg.top_p)
                return sample(p, gen), p
        return self.draft.chain(root, cfg.depth, sampler, cfg.min_prob, cfg.gate)

    def _spec_step(self, cfg: SpecConfig, gen, out: _Output, m: Metrics) -> None:
        t0 = time.perf_counter()
        tree = self._make_draft(cfg, out.ids, gen)
        t1 = time.perf_counter()
        dev = self.target.device
        x = torch.tensor([tree.all_tokens], device=dev)  # [1, N+1]
        chain = tree.is_chain()
        hidden, feats = self.runner.forward(
            x, tree.position_ids(self.runner.length, dev), None if chain else tree.ancestor_mask(dev))
        rows = _RowLogits(self.runner, hidden, tree.prefetch(PREFETCH_ROWS))
        if cfg.temperature == 0:
            path, bonus = walk_greedy(tree, rows)
        else:
            path, bonus = walk_sample(tree, rows, cfg.temperature, cfg.top_p, gen)
        self.runner.keep(len(tree) + 1, [0, *path])
        t2 = time.perf_counter()
        tokens = [tree.tokens[i - 1] for i in path] + [bonus]
        n = out.push(tokens)
        acc = min(len(path), n)
        m.steps.append(StepRecord(len(tree), max(tree.depths()), acc, n - acc))
        if not out.done:
            nxt = torch.tensor([tokens], device=dev)  # [1, a+1]: x[t+1] for each kept row
            self.draft.extend(nxt, feats[:, [0, *path]])
        m.time["draft"] += (t1 - t0) + (time.perf_counter() - t2)
        m.time["verify"] += t2 - t1
