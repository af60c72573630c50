"""A DFlash drafter vLLM can serve on this CPU, trained to accept: for the serve tests.

The target is tiny:mistral without its sliding window (vLLM's CPU attention runs its head_dim 32; a window
would test the window, not the wiring): unlike tiny:llama, whose greedy answer repeats one token, its answers
vary enough that a drafter reading the wrong layers drafts other tokens. The drafter (1 layer, blocks of 4,
z-lab ids [1, 3, 5], mask = the last vocabulary row) is trained on the target's own greedy continuations of
the held-out prompts `serve` checks on, a fixed number of steps (~10 s): it accepts ~2.5 of 3 drafts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.engine import SpecEngine
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.capture import capture
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
from eaglewire.targets.load import load_target
from eaglewire.targets.tiny import build_tiny
from eaglewire.training.dflash_loss import dflash_forward

IDS = (1, 3, 5)  # z-lab ids = layers.1/3/5.out of the 8-layer target
SHIFTED = [2, 4, 6]  # the same numbers + 1 under the z-lab key: the speculators/vLLM numbering confused
NUM_PROMPTS, MAX_NEW = 8, 48


def greedy(target, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """The target's own greedy continuations (transformers' generate: the independent reference)."""
    out = []
    for p in prompts:
        ids = target.model.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=target.eos_ids())
        out.append(ids[0, len(p):].tolist())
    return out


def check_prompts(target) -> list[list[int]]:
    """The held-out prompts `serve` checks on, tokenized as it does."""
    return encode_prompt_file(SpecEngine(target), heldout_prompts_path(), NUM_PROMPTS)[0]


def _train(target, prompts: list[list[int]], answers: list[list[int]], steps: int) -> DFlashDrafter:
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4,
                                          target_layer_ids=list(IDS))
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    t, pad = max(map(len, seqs)), target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([[0] * len(p) + [1] * len(a) + [0] * (t - len(p) - len(a)) for p, a in zip(prompts, answers)])
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
    """{target (dir), ckpt (DFlash checkpoint dir), prompts, answers (the target's greedy)}; `steps` 0: random."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a loaded 2-core machine: one thread is faster
    try:
        target_dir = build_tiny("mistral", Path(root) / "target", sliding_window=None)
        target = load_target(str(target_dir))
        prompts = check_prompts(target)
        answers = greedy(target, prompts, MAX_NEW)
        drafter = _train(target, prompts, answers, steps)
        prov = Provenance(points=drafter.config.points,
                          target=TargetRecord(source=str(target_dir), fingerprint=TargetFingerprint.of(target)))
        ckpt = save_dflash_checkpoint(Path(root) / "ckpt", drafter, prov)
    finally:
        torch.set_num_threads(before)
    return {"target": target_dir, "loaded": target, "ckpt": ckpt, "prompts": prompts, "answers": answers,
            "drafter": drafter}
