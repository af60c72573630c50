"""Lossless decoding with a P-EAGLE drafter (greedy or sampled): one drafter forward per round, a chain of K drafts.

The round is vLLM 0.32.0's V1 EAGLE proposer with ``parallel_drafting``
(``v1/spec_decode/llm_base_proposer.py``): the drafter's input is the rows of
the tokens the target kept in its last forward, shifted as EAGLE-3 shifts
them (``(x[t+1], f[t])`` at position ``t``, the last one carrying the bonus),
followed by K-1 mask slots; one forward yields K drafts
(:meth:`~eaglewire.drafter.peagle.PEagleDrafter.parallel_draft`). The target
verifies ``[bonus, d_1..d_K]`` in one forward and the longest prefix with
``d_i == argmax`` is kept (``verify.walk_greedy`` on a chain), then the
target's own token, exactly as ``decoding/dflash.py`` does for DFlash. The
drafter caches the real rows only; the mask slots are rebuilt every round.

Output equals the target's own greedy decoding whatever the drafter; what the
drafter changes is how many drafts are accepted. :class:`ParallelEngine` is
the EAGLE-3 engine's request loop (generate, bench, serve's check) with this
round in place of its draft/verify step, counted as vLLM counts: every round
drafts K (near the end of the request too: vLLM's scheduler does not shorten a
draft for max_tokens), and a round's accepted drafts are counted up to the
tokens the request kept (``BlockResult`` / ``dflash.block_stats``).

Sampling (``temperature > 0``) is DFlash's (decoding/dflash.py, where the
argument is written out): draft k's distribution ``p_k`` is the warped
softmax of its own row (the last real row for k = 1, mask slot k-1 after),
``d_k`` is one draw from it, and the chain goes through the engine's one
rejection rule (``verify_block``) with those ``p_k``. It is exact because no
row of the forward reads an earlier draft (the slots read the mask token and
``mask_hidden``), so ``d_k`` is drawn from ``p_k`` whatever was drawn or
accepted before it. vLLM does the same: with ``parallel_drafting`` its
proposer returns after the one forward and samples all K rows, each from its
own softmax (``llm_base_proposer.py`` ``propose``, ``_sample_from_logits``),
kept as ``draft_probs`` for ``v1/sample/rejection_sampler.py``.
"""

from __future__ import annotations

import time

import torch

from eaglewire.decoding.dflash import BlockResult, verify_block
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.metrics import Metrics, StepRecord
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.decoding.verify import sample, warp
from eaglewire.drafter.dflash import cat_context
from eaglewire.drafter.model import KV
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import Point


class ParallelDrafter:
    """The drafter's side of one sequence: its cache of real rows and one parallel forward per round."""

    def __init__(self, drafter: PEagleDrafter) -> None:
        self.drafter = drafter
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.reset()

    def reset(self) -> None:
        """A new sequence: no cached rows."""
        self.kv: list[KV] | None = None
        self.length = 0  # cached rows = positions 0 .. length-1

    @torch.inference_mode()
    def logits(self, next_tokens: list[int], features: torch.Tensor, k: int) -> torch.Tensor:
        """Append the rows ``(next_tokens[i], features[:, i])``; the k drafts' draft-vocab logits ``[k, D]``.

        ``features`` [1, n, A*Ht] are the target states of positions ``length .. length+n-1``; ``next_tokens``
        the n tokens that follow them (the last one is the bonus)."""
        n = len(next_tokens)
        ids = torch.tensor([next_tokens], device=self.device)  # [1, n]
        pos = torch.arange(self.length, self.length + n, device=self.device)[None]  # [1, n]
        logits, new = self.drafter.parallel_draft(ids, features.to(self.dtype), pos, self.kv, k)  # [1, k, D]
        self.kv = cat_context(self.kv, new)
        self.length += n
        return logits[0].float()

    def draft(self, next_tokens: list[int], features: torch.Tensor, k: int) -> list[int]:
        """k greedy drafts (target ids) after appending the rows (:meth:`logits`)."""
        return self.drafter.draft_to_target(self.logits(next_tokens, features, k).argmax(-1)).tolist()

    def draft_sampled(self, next_tokens: list[int], features: torch.Tensor, k: int, temperature: float,
                      top_p: float, gen: torch.Generator | None) -> tuple[list[int], list[torch.Tensor]]:
        """(drafts, their distributions ``p_k`` over the target vocabulary [V]): draft k is one draw from its own
        row's warped softmax (module docstring)."""
        probs = warp(self.logits(next_tokens, features, k), temperature, top_p)  # [k, D]
        ids = self.drafter.draft_target_ids()
        full = torch.zeros(k, self.drafter.config.vocab_size, device=probs.device).index_copy_(1, ids, probs)
        drafts = [sample(p, gen) for p in probs]
        return self.drafter.draft_to_target(torch.tensor(drafts, device=ids.device)).tolist(), list(full)


class ParallelEngine(SpecEngine):
    """P-EAGLE decoding of one request at a time (generate, bench, serve's check): the EAGLE-3 engine's request
    loop, stop rules and metrics, with one parallel drafter forward of ``cfg.depth`` drafts per round."""

    def __init__(self, target, drafter: PEagleDrafter, points: list[Point], fast: bool = True) -> None:
        if not points:
            raise EaglewireError("a drafter needs its capture points (provenance 'points.names')")
        self.target, self.drafter = target, drafter
        self.runner = TargetRunner(target, points, fast=fast)
        self.draft = ParallelDrafter(drafter)
        self.rows: tuple[list[int], torch.Tensor] | None = None  # verified rows the drafter has not read yet

    def generate(self, prompt_ids: list[int], cfg: SpecConfig):
        """``cfg.depth`` parallel drafts per round (mode chain; plain decodes plainly), greedy or sampled."""
        if cfg.mode == "tree":
            raise EaglewireError("mode 'tree': a P-EAGLE drafter drafts one chain of K tokens per round: use chain")
        return super().generate(prompt_ids, cfg)

    def _prefill(self, ids: list[int], cfg: SpecConfig, gen, out, m: Metrics) -> None:
        t0 = time.perf_counter()
        self.runner.reset()
        hidden, feats = self.runner.forward(torch.tensor([ids], device=self.target.device))
        tok = self._choose(self.runner.logits(hidden[0, -1:])[0], cfg, gen)
        m.prefill_tokens = out.push([tok])
        m.time["prefill"] += time.perf_counter() - t0
        self.draft.reset()
        self.rows = ([*ids[1:], tok], feats)  # x[t+1] for every prompt position t, the first token last

    def _spec_step(self, cfg: SpecConfig, gen, out, m: Metrics) -> None:
        """One parallel draft + verify; counted as vLLM counts (module docstring). Only the model's position
        limit shortens a round."""
        t0 = time.perf_counter()
        root = out.ids[-1]
        k = max(0, min(cfg.depth, self.runner.max_positions - self.runner.length - 1))
        tokens, feats = self.rows
        drafts, probs = [], None
        if k > 0 and cfg.temperature == 0:
            drafts = self.draft.draft(tokens, feats, k)
        elif k > 0:
            drafts, probs = self.draft.draft_sampled(tokens, feats, k, cfg.temperature, cfg.top_p, gen)
        t1 = time.perf_counter()
        hidden, feats = self.runner.forward(torch.tensor([[root, *drafts]], device=self.target.device))
        acc, bonus = verify_block(root, drafts, probs, self.runner.logits(hidden[0]).__getitem__, cfg.temperature,
                                  cfg.top_p, gen)
        self.runner.keep(k + 1, list(range(acc + 1)))
        t2 = time.perf_counter()
        n = out.push([*drafts[:acc], bonus])
        if k > 0:
            m.steps.append(StepRecord(k, k, min(acc, n), n - min(acc, n)))
        self.rows = ([*drafts[:acc], bonus], feats[:, : acc + 1])  # the verified positions: the next real rows
        m.time["draft"] += t1 - t0
        m.time["verify"] += t2 - t1


def generate_parallel(target, drafter: PEagleDrafter, points: list[Point], prompt_ids: list[int], max_new: int,
                      k: int = 3, fast: bool = True) -> BlockResult:
    """Greedy speculative decoding of ``prompt_ids`` with K parallel drafts per round; lossless.

    ``points`` are the drafter's capture points (its provenance), in the order its fc reads them."""
    if not prompt_ids or max_new < 1 or k < 1:
        raise EaglewireError(f"P-EAGLE decoding: expected a non-empty prompt, max_new >= 1 and k >= 1 "
                             f"(got {len(prompt_ids)} prompt tokens, max_new {max_new}, k {k})")
    r = ParallelEngine(target, drafter, points, fast=fast).generate(list(prompt_ids), SpecConfig(mode="chain", depth=k, max_new_tokens=max_new, min_prob=0.0))
    return BlockResult(r.token_ids, [s.accepted for s in r.metrics.steps], [s.drafted for s in r.metrics.steps])

