"""A DFlash drafter vLLM can serve on this CPU, trained to accept: for the serve tests.

The target and its greedy answers are served_target.py's (tiny:mistral without its sliding window). The
drafter (1 layer, blocks of 4, z-lab ids [1, 3, 5], mask = the last vocabulary row) is trained on the
target's own greedy continuations of the held-out prompts `serve` checks on, a fixed number of steps
(~10 s): it accepts ~2.5 of 3 drafts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.capture import capture
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.training.dflash_loss import dflash_forward
from eaglewire_testing.served_target import batch, build_served_run

IDS = (1, 3, 5)  # z-lab ids = layers.1/3/5.out of the 8-layer target
SHIFTED = [2, 4, 6]  # the same numbers + 1 under the z-lab key: the speculators/vLLM numbering confused


def _train(target, prompts: list[list[int]], answers: list[list[int]], steps: int) -> DFlashDrafter:
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4,
                                          target_layer_ids=list(IDS))
    x, attn, lm = batch(target, prompts, answers)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        store = capture(target.model, x, cfg.points, attention_mask=attn)
    feats = torch.cat([store[p.name] for p in cfg.points], -1)
    embed = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    drafter.train()
    for _ in range(steps):  # a fixed step count: every machine gets the same drafter
        out = dflash_forward(drafter, feats, x, embed, head, lm, num_anchors=16, attention_mask=attn, generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return drafter.eval()


def build_dflash_run(root: Path, steps: int = 300) -> dict:
    """{target (dir), loaded, ckpt (DFlash checkpoint dir), prompts, answers (the target's greedy), drafter};
    `steps` 0: random."""
    def make(target_dir, target, prompts, answers) -> dict:
        drafter = _train(target, prompts, answers, steps)
        prov = Provenance(points=drafter.config.points,
                          target=TargetRecord(source=str(target_dir), fingerprint=TargetFingerprint.of(target)))
        return {"ckpt": save_dflash_checkpoint(Path(root) / "ckpt", drafter, prov), "drafter": drafter}

    return build_served_run(root, make)
