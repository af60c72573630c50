"""A P-EAGLE drafter vLLM can serve on this CPU, trained to accept at its parallel slots: for the serve tests.

The target is dflash_serving.py's (tiny:mistral without its sliding window: vLLM's CPU attention runs its
head_dim 32, and its greedy answers vary enough that a drafter fed the wrong inputs drafts other tokens). The
drafter (1 layer, EAGLE-3's default capture points, the full vocabulary, mask = the last vocabulary row, the
target's frozen embedding) is trained with training/peagle_loss.py's `peagle_forward` at 3 depths on the
target's own greedy continuations of the held-out prompts `serve` checks on, a fixed number of steps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.drafter.config import DrafterConfig
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.capture import capture
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord, chat_template_hash
from eaglewire.targets.load import load_target
from eaglewire.targets.points import FINAL_NORM, eagle3_default
from eaglewire.targets.tiny import build_tiny
from eaglewire.training.peagle_loss import peagle_forward
from eaglewire_testing.dflash_serving import MAX_NEW, check_prompts, greedy

DEPTHS = 3  # parallel positions trained, and vLLM's num_speculative_tokens


def batch(target, prompts: list[list[int]], answers: list[list[int]]):
    """(ids, attention mask, loss mask) of prompt + answer rows, right-padded, the loss on the answers."""
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    t, pad = max(map(len, seqs)), target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([[0] * len(p) + [1] * len(a) + [0] * (t - len(p) - len(a))
                       for p, a in zip(prompts, answers, strict=True)])
    return x, attn, lm


def train_peagle(target, prompts: list[list[int]], answers: list[list[int]], steps: int) -> tuple[PEagleDrafter, list]:
    """(drafter, its capture points); `steps` 0 leaves the random initialisation."""
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=target.vocab_size)
    points = eagle3_default(target.num_layers)
    torch.manual_seed(0)
    drafter = PEagleDrafter(cfg, mask_token_id=target.vocab_size - 1)
    drafter.load_target_embedding(target.model.get_input_embeddings().weight)
    x, attn, lm = batch(target, prompts, answers)
    with torch.no_grad():
        store = capture(target.model, x, [*points, FINAL_NORM], attention_mask=attn)
    feats = torch.cat([store[p.name] for p in points], -1)
    head = target.model.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    drafter.train()
    for _ in range(steps):  # a fixed step count: every machine gets the same drafter
        out = peagle_forward(drafter, feats, x, store[FINAL_NORM.name], head, lm, depths=DEPTHS,
                             attention_mask=attn, generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return drafter.eval(), points


def build_peagle_run(root: Path, steps: int = 300) -> dict:
    """{target (dir), loaded, ckpt (P-EAGLE checkpoint dir), prompts, answers (the target's greedy), drafter,
    points}."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a loaded 2-core machine: one thread is faster
    try:
        target_dir = build_tiny("mistral", Path(root) / "target", sliding_window=None)
        target = load_target(str(target_dir))
        prompts = check_prompts(target)
        answers = greedy(target, prompts, MAX_NEW)
        drafter, points = train_peagle(target, prompts, answers, steps)
        prov = Provenance(points=points, chat_template_sha=chat_template_hash(target.tokenizer),
                          target=TargetRecord(source=str(target_dir), fingerprint=TargetFingerprint.of(target)))
        ckpt = save_checkpoint(Path(root) / "ckpt", drafter, prov, depths=DEPTHS)
    finally:
        torch.set_num_threads(before)
    return {"target": target_dir, "loaded": target, "ckpt": ckpt, "prompts": prompts, "answers": answers,
            "drafter": drafter, "points": points}
