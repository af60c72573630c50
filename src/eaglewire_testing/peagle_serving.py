"""A P-EAGLE drafter vLLM can serve on this CPU, trained to accept at its parallel slots: for the serve tests.

The target and its greedy answers are served_target.py's (tiny:mistral without its sliding window). The
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
from eaglewire.targets.points import FINAL_NORM, eagle3_default
from eaglewire.training.peagle_loss import peagle_forward
from eaglewire_testing.served_target import batch, build_served_run

DEPTHS = 3  # parallel positions trained, and vLLM's num_speculative_tokens


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
    def make(target_dir, target, prompts, answers) -> dict:
        drafter, points = train_peagle(target, prompts, answers, steps)
        prov = Provenance(points=points, chat_template_sha=chat_template_hash(target.tokenizer),
                          target=TargetRecord(source=str(target_dir), fingerprint=TargetFingerprint.of(target)))
        ckpt = save_checkpoint(Path(root) / "ckpt", drafter, prov, depths=DEPTHS)
        return {"ckpt": ckpt, "drafter": drafter, "points": points}

    return build_served_run(root, make)
