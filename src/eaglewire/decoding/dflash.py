"""Lossless greedy block decoding with a DFlash drafter (chain of depth B-1 per round).

A round, as z-lab ``dflash/model.py`` ``dflash_generate`` and vLLM 0.32.0
``v1/spec_decode/dflash.py`` run it: the drafter reads ``[bonus, MASK x K]``
at positions ``p .. p+K`` (``p`` = the bonus token's position) against the
context K/V of every verified position ``< p`` and drafts slots 1..K in one
forward; the target verifies ``[bonus, d_1..d_K]`` in one forward; the
longest prefix with ``d_i == argmax`` is accepted (``verify.walk_greedy`` on a
chain), then the target's own token. The target states captured at the
verified positions ``p .. p+accepted`` become the next context, so the
drafter's context K/V grows by exactly the tokens the target kept.

Output equals the target's own greedy decoding whatever the drafter (an
untrained one only accepts less). Acceptance is reported as vLLM counts it:
``1 + accepted`` tokens per round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.decoding.tree import DraftTree
from eaglewire.decoding.verify import walk_greedy
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


class BlockDrafter:
    """The drafter's side of one sequence: its growing context K/V and one block forward per round."""

    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor,
                 logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.drafter = drafter
        self.embed_weight = embed_weight  # [V, H] the target's
        self.logits = logits  # rows [M, H] -> [M, V] through the target's lm_head (and its softcap)
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
    def draft(self, bonus: int, k: int) -> list[int]:
        """Greedy drafts for slots 1..k of ``[bonus, MASK x k]`` at positions ``length .. length+k``."""
        c = self.drafter.config
        dev = self.embed_weight.device
        tokens = torch.tensor([[bonus] + [c.mask_token_id] * k], device=dev)  # [1, k+1]
        pos = torch.arange(self.length, self.length + k + 1, device=dev)[None]
        dtype = next(self.drafter.parameters()).dtype
        hidden = self.drafter.block(F.embedding(tokens, self.embed_weight).to(dtype), pos, self.ctx)
        return self.logits(hidden[0, 1:].to(self.embed_weight.dtype)).argmax(-1).tolist()  # [k, V] -> k ids


@torch.inference_mode()
def generate_block(target, drafter: DFlashDrafter, prompt_ids: list[int], max_new: int,
                   eos_ids: list[int] | None = None, fast: bool = True) -> BlockResult:
    """Greedy speculative decoding of ``prompt_ids`` with a DFlash drafter; lossless.

    ``target`` is a loaded :class:`~eaglewire.targets.load.Target`; the drafter's ``target_layer_ids``
    (z-lab meaning, ``layers.{k}.out``) name the captured points."""
    if not prompt_ids or max_new < 1:
        raise EaglewireError(f"block decoding: expected a non-empty prompt and max_new >= 1 "
                             f"(got {len(prompt_ids)} prompt tokens, max_new {max_new})")
    eos = set(target.eos_ids() if eos_ids is None else eos_ids)
    runner = TargetRunner(target, drafter.config.points, fast=fast)
    side = BlockDrafter(drafter, target.model.get_input_embeddings().weight, runner.logits)
    dev = target.device
    hidden, feats = runner.forward(torch.tensor([prompt_ids], device=dev))
    side.extend(feats)
    out = [int(runner.logits(hidden[0, -1:])[0].argmax())]
    res = BlockResult(out)
    while len(out) < max_new and out[-1] not in eos:
        k = min(drafter.config.block_size - 1, max_new - len(out) - 1)
        drafts = side.draft(out[-1], k) if k > 0 else []
        hidden, feats = runner.forward(torch.tensor([[out[-1], *drafts]], device=dev))
        rows = runner.logits(hidden[0])  # [k+1, V]
        tree = DraftTree(root=out[-1], tokens=drafts, parents=list(range(k)))
        path, bonus = walk_greedy(tree, rows.__getitem__)
        acc = len(path)
        runner.keep(k + 1, list(range(acc + 1)))
        side.extend(feats[:, : acc + 1])
        if k > 0:
            res.accepted.append(acc)
            res.drafted.append(k)
        for tok in [*drafts[:acc], bonus]:
            out.append(tok)
            if tok in eos:
                break
    return res
