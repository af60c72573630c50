"""The offline acceptance walk for a DFlash drafter: block rounds replayed along stored answers.

Why: held-out acceptance must be comparable across drafter kinds, and run
without the target. `acceptance.chain_stats` replays EAGLE-3 chains along the
target's answers; this replays DFlash blocks the same way, so the two figures
count rounds identically (`round_masks`, `decode_rounds`: a round whose known
tokens end at t + 1 drafts tokens t + 2 .., and accepting r drafts moves r + 1
tokens on). A round's block is what decoding runs at that point: context = the
stored target states of positions <= t, block `[token t + 1, MASK x depth]` at
positions t + 1 .., slot k's argmax compared with the target's own argmax
(`target_hidden` through the head), exactly what a greedy verify accepts. On
greedy answers this equals online block decoding round for round
(tests/decoding/test_block_acceptance.py checks it against `BlockEngine`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglewire.data.dataset import collate
from eaglewire.decoding.acceptance import decode_rounds, round_masks, rounds_summary
from eaglewire.drafter.dflash import DFlashDrafter
from eaglewire.drafter.ttt import target_full_argmax
from eaglewire.infra.errors import EaglewireError


def slot_indices(manifest_points: list[str], want: list[str], who: str = "the DFlash drafter") -> list[int]:
    """Where each of the drafter's points sits among the dataset's stored slots (one line when one is missing)."""
    missing = [n for n in want if n not in manifest_points]
    if missing:
        raise EaglewireError(f"the dataset stores {manifest_points}; {who} reads {want} "
                             f"({', '.join(missing)} missing): build the dataset with --points {','.join(want)}")
    return [manifest_points.index(n) for n in want]


@torch.no_grad()
def _sample_rounds(drafter: DFlashDrafter, sample: dict, slots: list[int], embed_w: torch.Tensor,
                   head_w: torch.Tensor, depth: int) -> list[int]:
    """Accepted drafts per round along one stored answer, walking as decoding does (blocks only where it starts one)."""
    b = collate([sample])
    feats = b["features"][:, :, slots].float().flatten(2)  # [1, T, A*H]
    ids = b["input_ids"][0]  # [T]
    T = ids.shape[0]
    tgt = target_full_argmax(b["target_hidden"].float(), head_w)[0]  # [T]: the target's next token after t
    served, start = round_masks(b, depth)  # [1, T, depth], [1, T]
    ctx = drafter.context_kv(feats, torch.arange(T)[None])  # per layer [1, nkv, T, hd]
    mask_id = drafter.config.mask_token_id

    def run(t: int) -> int:  # accepted drafts of the round whose known tokens end at t + 1
        p = t + 1  # the block's known token (the round's bonus)
        tokens = torch.tensor([[int(ids[p])] + [mask_id] * depth])  # [1, depth+1]
        pos = torch.arange(p, p + depth + 1)[None]
        h = drafter.block(F.embedding(tokens, embed_w), pos, [(k[:, :, :p], v[:, :, :p]) for k, v in ctx])
        drafts = (h[0, 1:] @ head_w.T).argmax(-1)  # [depth] slot k drafts token p + k
        want = tgt[p:p + depth]  # the target's tokens at p + 1 .. p + depth
        hit = (drafts[:len(want)] == want) & served[0, t, :len(want)]
        return int(torch.cumprod(hit.long(), 0).sum())

    return decode_rounds(run, start[0])


def block_chain_stats(drafter: DFlashDrafter, ds, embed_w: torch.Tensor, head_w: torch.Tensor, num_samples: int,
                      depth: int) -> dict:
    """vLLM's figures for a DFlash drafter on stored answers: 1 + accepted per round, per position, its 95% interval."""
    if not 1 <= depth <= drafter.config.block_size - 1:
        raise EaglewireError(f"depth {depth}: a DFlash drafter with block_size {drafter.config.block_size} drafts "
                             f"1..{drafter.config.block_size - 1} tokens per round")
    slots = slot_indices([p.name for p in ds.manifest.points or []], [p.name for p in drafter.config.points])
    drafter = drafter.float().eval()
    embed_w, head_w = embed_w.float(), head_w.float()
    rounds = [_sample_rounds(drafter, ds[i], slots, embed_w, head_w, depth) for i in range(min(num_samples, len(ds)))]
    return rounds_summary(rounds, depth)
