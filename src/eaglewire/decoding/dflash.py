"""Lossless block decoding with a DFlash drafter: greedy or sampled, a chain of up to B-1 drafts per round.

A round, as z-lab ``dflash/model.py`` ``dflash_generate`` and vLLM 0.32.0
``v1/spec_decode/dflash.py`` run it: the drafter reads ``[bonus, MASK x K]``
at positions ``p .. p+K`` (``p`` = the bonus token's position) against the
context K/V of every verified position ``< p`` and drafts slots 1..K in one
forward; the target verifies ``[bonus, d_1..d_K]`` in one forward; the
longest accepted prefix is kept, then the target's own token. The target
states captured at the verified positions ``p .. p+accepted`` become the
next context, so the drafter's context K/V grows by exactly the tokens the
target kept.

Greedy: ``d_k`` = argmax of slot k; a draft is accepted while it equals the
target's argmax (``verify.walk_greedy`` on a chain), so the output is the
target's own greedy decoding whatever the drafter.

Sampling (``temperature > 0``): slot k's draft distribution is
``p_k = warp(lm_head(slot_k), T, top_p)``, the same warp the target's ``q``
gets, and ``d_k`` is drawn from ``p_k``; the chain ``[d_1..d_K]`` with
``probs = [p_1..p_K]`` goes through ``verify.walk_sample``, the engine's one
rejection rule (accept with ``min(1, q/p)``, on rejection sample
``norm(max(0, q - p))``). This is exact although slot k never sees the
sampled ``d_{k-1}`` (the block reads MASK there): the rule needs, at each
position, the distribution the draft was actually drawn from given
everything decided before it. ``d_k`` is drawn from ``p_k`` independently of
``d_{<k}`` and of the acceptance coins, so given that ``d_{<k}`` were
accepted it is still a draw from ``p_k``, and accepting with
``min(1, q_k/p_k)`` / resampling from the residual emits exactly ``q_k``.
Verifying slot k with any other slot's distribution breaks this (the tests
plant that bug and see it caught). vLLM does the same: its proposer
(``v1/spec_decode/llm_base_proposer.py`` ``_sample_from_logits``, shared by
``DFlashProposer``) samples the K parallel rows each from its own softmax with
the request's temperature repeated per row and keeps those probabilities as
``draft_probs``; ``v1/sample/rejection_sampler.py``
(``rejection_random_sample_kernel``, ``sample_recovered_tokens_kernel``)
accepts position ``pos`` when ``q/p >= u`` and recovers from
``max(q - p, 0)``, position by position along the chain.

Acceptance is reported as vLLM counts it: ``1 + accepted`` tokens per
drafting round, ``num_accepted_tokens_per_pos`` per draft position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from eaglewire.decoding.engine import Result, SpecConfig, SpecEngine
from eaglewire.decoding.metrics import Metrics, StepRecord
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.decoding.tree import DraftTree
from eaglewire.decoding.verify import sample, walk_greedy, walk_sample, warp
from eaglewire.drafter.dflash import KV, DFlashDrafter, cat_context
from eaglewire.infra.errors import EaglewireError


@dataclass
class BlockResult:
    tokens: list[int]  # generated tokens (the prompt excluded), eos included when hit
    accepted: list[int] = field(default_factory=list)  # drafts accepted per drafting round
    drafted: list[int] = field(default_factory=list)  # drafts proposed per drafting round (K)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per drafting round, vLLM's ``1 + accepted`` (0 when no round drafted)."""
        return sum(1 + a for a in self.accepted) / len(self.accepted) if self.accepted else 0.0

    def accepted_per_pos(self) -> list[int]:
        """Rounds whose draft at position i (0-based) was accepted: vLLM's ``num_accepted_tokens_per_pos``."""
        width = max(self.drafted, default=0)
        return [sum(1 for a in self.accepted if a > i) for i in range(width)]


def block_stats(m: Metrics) -> dict:
    """The drafting rounds as vLLM's spec-decode metrics count them (``--json`` of generate and bench)."""
    r = BlockResult([], [s.accepted for s in m.steps], [s.drafted for s in m.steps])
    rounds = len(r.accepted)
    return {"acceptance_length": r.acceptance_length, "drafting_rounds": rounds,
            "accepted_per_pos": r.accepted_per_pos(),
            "acceptance_rate_per_pos": [a / rounds for a in r.accepted_per_pos()] if rounds else [],
            "drafted_per_round": sum(r.drafted) / rounds if rounds else 0.0,
            "note": "acceptance_length = mean of 1 + accepted drafts over drafting rounds (vLLM); "
                    "accepted_per_pos[i] = rounds whose draft i+1 was accepted (num_accepted_tokens_per_pos)"}


class BlockDrafter:
    """The drafter's side of one sequence: its growing context K/V and one block forward per round."""

    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor,
                 logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.drafter = drafter
        self.embed_weight = embed_weight  # [V, H] the target's
        self.logits = logits  # rows [M, H] -> [M, V] through the target's lm_head (and its softcap)
        self.reset()

    def reset(self) -> None:
        """A new sequence: no context yet."""
        self.ctx: list[KV] | None = None
        self.length = 0  # positions in the context

    @torch.inference_mode()
    def extend(self, features: torch.Tensor) -> None:
        """Append the target states ``[1, n, A*H]`` of the next n verified positions to the context."""
        n = features.shape[1]
        pos = torch.arange(self.length, self.length + n, device=features.device)[None]
        self.ctx = cat_context(self.ctx, self.drafter.context_kv(features, pos))
        self.length += n

    @torch.inference_mode()
    def slot_logits(self, bonus: int, k: int) -> torch.Tensor:
        """fp32 logits ``[k, V]`` of slots 1..k of ``[bonus, MASK x k]`` at positions ``length .. length+k``."""
        c = self.drafter.config
        dev = self.embed_weight.device
        tokens = torch.tensor([[bonus] + [c.mask_token_id] * k], device=dev)  # [1, k+1]
        pos = torch.arange(self.length, self.length + k + 1, device=dev)[None]
        dtype = next(self.drafter.parameters()).dtype
        hidden = self.drafter.block(F.embedding(tokens, self.embed_weight).to(dtype), pos, self.ctx)
        return self.logits(hidden[0, 1:].to(self.embed_weight.dtype))  # [k, V]

    def draft(self, bonus: int, k: int) -> list[int]:
        """Greedy drafts for slots 1..k."""
        return self.slot_logits(bonus, k).argmax(-1).tolist()

    def draft_sampled(self, bonus: int, k: int, temperature: float, top_p: float,
                      gen: torch.Generator | None) -> tuple[list[int], list[torch.Tensor]]:
        """(drafts, their distributions ``p_k`` [V]): slot k's draft is one draw from its own ``p_k``."""
        probs = list(warp(self.slot_logits(bonus, k), temperature, top_p))  # k x [V]
        return [sample(p, gen) for p in probs], probs


def chain_tree(root: int, drafts: list[int], probs: list[torch.Tensor] | None) -> DraftTree:
    """The block's drafts as a chain rooted at the bonus token; ``probs[i]`` = the distribution d_{i+1} was drawn from."""
    return DraftTree(root=root, tokens=list(drafts), parents=list(range(len(drafts))), probs=list(probs or []))


def verify_block(root: int, drafts: list[int], probs: list[torch.Tensor] | None,
                 rows: Callable[[int], torch.Tensor], temperature: float = 0.0, top_p: float = 1.0,
                 gen: torch.Generator | None = None) -> tuple[int, int]:
    """(drafts accepted, the target's token after them); ``rows(i)`` = the target's logits after chain index i.

    Greedy when ``temperature == 0`` (``probs`` unused), else the engine's rejection rule (verify.py)."""
    tree = chain_tree(root, drafts, probs if temperature > 0 else None)
    if temperature == 0:
        path, bonus = walk_greedy(tree, rows)
    else:
        path, bonus = walk_sample(tree, rows, temperature, top_p, gen)
    return len(path), bonus


class BlockEngine(SpecEngine):
    """Block decoding of one request at a time (generate, bench, doctor live): the EAGLE-3 engine's request
    loop, stop rules, sampling and metrics, with a DFlash round in place of its draft/verify step."""

    def __init__(self, target, drafter: DFlashDrafter, fast: bool = True) -> None:
        self.target, self.drafter = target, drafter
        self.runner = TargetRunner(target, drafter.config.points, fast=fast)
        self.draft = BlockDrafter(drafter, target.model.get_input_embeddings().weight, self.runner.logits)

    def check_depth(self, depth: int) -> None:
        """Drafts per round: at most the block's B-1 mask slots."""
        most = self.drafter.config.block_size - 1
        if not 1 <= depth <= most:
            raise EaglewireError(f"--depth {depth}: a DFlash drafter with block_size {most + 1} drafts "
                                 f"1..{most} tokens per round (block_size - 1)")

    def generate(self, prompt_ids: list[int], cfg: SpecConfig) -> Result:
        """``cfg.depth`` drafts per round (mode chain; plain decodes plainly); temperature, top_p, seed, stop
        strings and the metrics as the EAGLE-3 engine."""
        if cfg.mode == "tree":
            raise EaglewireError("mode 'tree': a DFlash drafter drafts one block (a chain) per round: use chain")
        self.check_depth(cfg.depth)
        return super().generate(prompt_ids, cfg)

    def _prefill(self, ids: list[int], cfg: SpecConfig, gen, out, m: Metrics) -> None:
        t0 = time.perf_counter()
        self.runner.reset()
        hidden, feats = self.runner.forward(torch.tensor([ids], device=self.target.device))
        m.prefill_tokens = out.push([self._choose(self.runner.logits(hidden[0, -1:])[0], cfg, gen)])
        t1 = time.perf_counter()
        m.time["prefill"] += t1 - t0
        if cfg.mode != "plain" and not out.done:
            self.draft.reset()
            self.draft.extend(feats)
            m.time["draft"] += time.perf_counter() - t1

    def _spec_step(self, cfg: SpecConfig, gen, out, m: Metrics) -> None:
        """One draft + verify. Every round drafts the full depth, near the end of the budget too, and counts
        as accepted only the drafts the request keeps: vLLM's count (and the EAGLE-3 engine's), so a served
        acceptance equals this one round for round. Only the model's position limit shortens a block."""
        t0 = time.perf_counter()
        side, root = self.draft, out.ids[-1]
        k = max(0, min(cfg.depth, self.runner.max_positions - self.runner.length - 1))
        probs = None
        if k == 0:
            drafts = []
        elif cfg.temperature == 0:
            drafts = side.draft(root, k)
        else:
            drafts, probs = side.draft_sampled(root, k, cfg.temperature, cfg.top_p, gen)
        t1 = time.perf_counter()
        hidden, feats = self.runner.forward(torch.tensor([[root, *drafts]], device=self.target.device))
        rows = self.runner.logits(hidden[0])  # [k+1, V]
        acc, bonus = verify_block(root, drafts, probs, rows.__getitem__, cfg.temperature, cfg.top_p, gen)
        self.runner.keep(k + 1, list(range(acc + 1)))
        t2 = time.perf_counter()
        n = out.push([*drafts[:acc], bonus])
        if k > 0:
            m.steps.append(StepRecord(k, k, min(acc, n), n - min(acc, n)))
        if not out.done:
            side.extend(feats[:, : acc + 1])
        m.time["draft"] += (t1 - t0) + (time.perf_counter() - t2)
        m.time["verify"] += t2 - t1


def generate_block(target, drafter: DFlashDrafter, prompt_ids: list[int], max_new: int, fast: bool = True,
                   temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> BlockResult:
    """Speculative decoding of ``prompt_ids`` with a DFlash drafter, a full block (B-1 drafts) per round; lossless.

    ``target`` is a loaded :class:`~eaglewire.targets.load.Target`; the drafter's ``target_layer_ids``
    (z-lab meaning, ``layers.{k}.out``) name the captured points."""
    if not prompt_ids or max_new < 1:
        raise EaglewireError(f"block decoding: expected a non-empty prompt and max_new >= 1 "
                             f"(got {len(prompt_ids)} prompt tokens, max_new {max_new})")
    cfg = SpecConfig(mode="chain", depth=drafter.config.block_size - 1, temperature=temperature, top_p=top_p,
                     max_new_tokens=max_new, seed=seed)
    r = BlockEngine(target, drafter, fast=fast).generate(prompt_ids, cfg)
    return BlockResult(r.token_ids, [s.accepted for s in r.metrics.steps], [s.drafted for s in r.metrics.steps])
