"""DFlash block decoding: lossless against the target's own greedy output, drafts read the verified context,
a trained drafter accepts where a random one does not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding import dflash as block_decoding
from eaglewire.decoding.dflash import generate_block
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.chat import encode, render
from eaglewire.training.dflash_loss import dflash_forward

pytestmark = pytest.mark.unit
MAX_NEW = 24


def prompt_ids(target, text: str) -> list[int]:
    tok = target.tokenizer
    return encode(tok, render(tok, [{"role": "user", "content": text}], True))


def dflash_drafter(target, seed: int = 0) -> DFlashDrafter:
    """One draft layer, blocks of 4; the mask is the last embedding row."""
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4)
    torch.manual_seed(seed)
    return DFlashDrafter(cfg).eval()


def check_counts(res, max_new: int, eos: list[int]) -> None:
    """vLLM's count: a round yields 1 + accepted tokens and the first token comes from the prompt; every round
    drafts a whole block, so the last one may keep only its accepted drafts (max_tokens reached before its
    bonus), and counts only those. An eos may cut the last round short."""
    by_rounds = 1 + sum(1 + a for a in res.accepted)
    assert len(res.tokens) <= max_new
    if res.tokens[-1] in eos:
        assert len(res.tokens) <= by_rounds
    else:
        assert len(res.tokens) - by_rounds in (-1, 0)
    if res.accepted:
        assert res.acceptance_length == pytest.approx(by_rounds / len(res.accepted) - 1 / len(res.accepted))
    assert all(0 <= a <= k for a, k in zip(res.accepted, res.drafted, strict=True))
    per_pos = res.accepted_per_pos()  # vLLM's num_accepted_tokens_per_pos: position i counts when a > i
    assert sum(per_pos) == sum(res.accepted) and per_pos == sorted(per_pos, reverse=True)


@pytest.mark.parametrize("arch,n", [("llama", 2), ("qwen3", 2)])
def test_random_drafter_is_lossless(tiny_targets, arch, n):
    target = tiny_targets[arch]
    drafter = dflash_drafter(target)
    for text in PROMPTS[:n]:
        ids = prompt_ids(target, text)
        res = generate_block(target, drafter, ids, MAX_NEW)
        assert res.tokens == greedy_reference(target, ids, MAX_NEW), text
        check_counts(res, MAX_NEW, target.eos_ids())


def test_empty_requests_are_refused(tiny_targets):
    target = tiny_targets["llama"]
    with pytest.raises(EaglewireError, match="non-empty prompt and max_new >= 1"):
        generate_block(target, dflash_drafter(target), [], 4)
    with pytest.raises(EaglewireError, match="got 2 prompt tokens, max_new 0"):
        generate_block(target, dflash_drafter(target), [1, 2], 0)


def own_continuations(target, n: int = 6, new: int = 32):
    seqs, masks = [], []
    for p in PROMPTS[:n]:
        ids = prompt_ids(target, p)
        cont = greedy_reference(target, ids, new)
        seqs.append(ids + cont)
        masks.append([0] * len(ids) + [1] * len(cont))
    t = max(map(len, seqs))
    pad = target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([m + [0] * (t - len(m)) for m in masks])
    return x, attn, lm


@pytest.fixture(scope="module")
def trained(tiny_targets):
    """A DFlash drafter trained on tiny:mistral's own greedy continuations: (drafter, losses per step).

    Not tiny:llama: its greedy output repeats one token, which any context bookkeeping would still predict."""
    target = tiny_targets["mistral"]
    x, attn, lm = own_continuations(target)
    drafter = dflash_drafter(target)
    points = drafter.config.points
    store = capture(target.model, x, points, attention_mask=attn)
    feats = torch.cat([store[p.name] for p in points], -1)
    embed = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):  # a fixed step count, not a time budget: every machine gets the same drafter
        out = dflash_forward(drafter, feats, x, embed, head, lm, num_anchors=8, attention_mask=attn, generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    return drafter.eval(), losses


def test_training_reduces_the_loss(trained):
    _, losses = trained
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.7 * first, (first, last)


def test_trained_drafter_accepts_and_stays_lossless(tiny_targets, trained):
    target = tiny_targets["mistral"]
    drafter, _ = trained
    rand = dflash_drafter(target, seed=1)
    got = {"trained": [], "random": []}
    for text in PROMPTS[:4]:
        ids = prompt_ids(target, text)
        ref = greedy_reference(target, ids, MAX_NEW)
        for name, d in (("trained", drafter), ("random", rand)):
            res = generate_block(target, d, ids, MAX_NEW)
            assert res.tokens == ref, (name, text)
            check_counts(res, MAX_NEW, target.eos_ids())
            got[name] += res.accepted
    mean = {k: sum(v) / len(v) for k, v in got.items()}
    assert mean["random"] < 0.2 and mean["trained"] > mean["random"] + 0.5, mean


def test_drafts_read_the_verified_context(tiny_targets, trained, monkeypatch):
    """Every round's drafts equal a from-scratch reference: target states of positions < p from one fresh forward
    over the sequence so far, the block [bonus, MASK x k] at p .. p+k, argmax through the target head."""
    target = tiny_targets["mistral"]
    drafter, _ = trained
    calls = []
    real = block_decoding.BlockDrafter.draft

    def spy(self, bonus, k):
        drafts = real(self, bonus, k)
        calls.append((self.length, bonus, k, drafts))
        return drafts

    monkeypatch.setattr(block_decoding.BlockDrafter, "draft", spy)
    ids = prompt_ids(target, PROMPTS[0])
    res = generate_block(target, drafter, ids, MAX_NEW)
    seq = ids + res.tokens
    points = drafter.config.points
    embed = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    assert len(calls) >= 3
    with torch.no_grad():
        for p, bonus, k, drafts in calls:
            assert seq[p] == bonus  # the bonus sits at the first position the context does not cover
            store = capture(target.model, torch.tensor([seq[:p]]), points)
            feats = torch.cat([store[pt.name] for pt in points], -1)
            ctx = drafter.context_kv(feats, torch.arange(p)[None])
            toks = torch.tensor([[bonus] + [drafter.config.mask_token_id] * k])
            h = drafter.block(F.embedding(toks, embed), torch.arange(p, p + k + 1)[None], ctx)
            assert (h[0, 1:] @ head.T).argmax(-1).tolist() == drafts
