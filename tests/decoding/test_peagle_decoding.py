"""P-EAGLE decoding: lossless against the target's own greedy output, every round's drafts equal a from-scratch
parallel forward over the verified sequence, and a drafter trained by training/peagle_loss.py gets accepted."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding import peagle as peagle_decoding
from eaglewire.decoding.peagle import generate_parallel
from eaglewire.drafter import DrafterConfig
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.chat import encode, render
from eaglewire.targets.points import FINAL_NORM, eagle3_default
from eaglewire.training.peagle_loss import peagle_forward

pytestmark = pytest.mark.unit
MAX_NEW = 24


def prompt_ids(target, text: str) -> list[int]:
    tok = target.tokenizer
    return encode(tok, render(tok, [{"role": "user", "content": text}], True))


def peagle_drafter(target, seed: int = 0) -> tuple[PEagleDrafter, list]:
    """Full draft vocabulary, the target's frozen embedding; the mask is the last embedding row."""
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=target.vocab_size)
    torch.manual_seed(seed)
    d = PEagleDrafter(cfg, mask_token_id=target.vocab_size - 1)
    d.load_target_embedding(target.model.get_input_embeddings().weight)
    return d.eval(), eagle3_default(target.num_layers)


def check_counts(res, max_new: int, k: int) -> None:
    """vLLM's count: 1 + accepted tokens per drafting round, plus the prompt's token and a last plain step."""
    assert len(res.tokens) <= max_new
    assert all(0 <= a <= n <= k for a, n in zip(res.accepted, res.drafted, strict=True))
    per_pos = res.accepted_per_pos()
    assert sum(per_pos) == sum(res.accepted) and per_pos == sorted(per_pos, reverse=True)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_random_drafter_is_lossless(tiny_targets, arch):
    target = tiny_targets[arch]
    drafter, points = peagle_drafter(target)
    for text, k in zip(PROMPTS[:2], (3, 5), strict=True):
        ids = prompt_ids(target, text)
        res = generate_parallel(target, drafter, points, ids, MAX_NEW, k=k)
        assert res.tokens == greedy_reference(target, ids, MAX_NEW), (arch, text)
        check_counts(res, MAX_NEW, k)
        assert res.drafted and max(res.drafted) == k


def test_empty_requests_are_refused(tiny_targets):
    target = tiny_targets["llama"]
    drafter, points = peagle_drafter(target)
    with pytest.raises(EaglewireError, match="got 0 prompt tokens, max_new 4, k 3"):
        generate_parallel(target, drafter, points, [], 4)
    with pytest.raises(EaglewireError, match="got 2 prompt tokens, max_new 4, k 0"):
        generate_parallel(target, drafter, points, [1, 2], 4, k=0)


@pytest.mark.parametrize("bug", [False, True])
def test_drafts_read_the_verified_sequence(tiny_targets, monkeypatch, bug):
    """Each round's drafts = one parallel forward from scratch over the sequence so far: rows (x[t+1], f[t]) for
    every verified position t, features from a fresh target forward, then the mask slots. The planted bug, features
    one position behind their tokens (f[t-1] with x[t+1], the classic EAGLE misalignment), must be seen by it."""
    target = tiny_targets["qwen3"]
    drafter, points = peagle_drafter(target, seed=2)
    calls = []
    real = peagle_decoding.ParallelDrafter.draft

    last = []

    def spy(self, next_tokens, features, k):
        start = self.length
        if bug:
            behind = torch.cat([*(last or [features[:, :1]]), features[:, :-1]], 1)
            last[:] = [features[:, -1:]]
            features = behind
        drafts = real(self, next_tokens, features, k)
        calls.append((start, list(next_tokens), k, drafts))
        return drafts

    monkeypatch.setattr(peagle_decoding.ParallelDrafter, "draft", spy)
    ids = prompt_ids(target, PROMPTS[2])
    res = generate_parallel(target, drafter, points, ids, 12, k=3)
    seq = ids + res.tokens
    assert len(calls) >= 3 and res.tokens == greedy_reference(target, ids, 12)  # lossless even when buggy
    same = []
    with torch.no_grad():
        for start, new, k, drafts in calls:
            end = start + len(new)  # rows 0 .. end-1 after this round's extension
            assert new == seq[start + 1: end + 1]  # x[t+1] of the newly verified positions, the bonus last
            store = capture(target.model, torch.tensor([seq[:end]]), points)
            feats = torch.cat([store[p.name] for p in points], -1)
            logits, _ = drafter.parallel_draft(torch.tensor([seq[1: end + 1]]), feats, torch.arange(end)[None],
                                               None, k)
            same.append(logits[0].argmax(-1).tolist() == drafts)
    assert all(same) if not bug else not all(same), same


def own_continuations(target, n: int = 4, new: int = MAX_NEW):
    """The target's greedy continuations of the first n prompts, as a right-padded batch with the loss on them."""
    prompts, conts = [prompt_ids(target, p) for p in PROMPTS[:n]], []
    for ids in prompts:
        conts.append(greedy_reference(target, ids, new))
    seqs = [p + c for p, c in zip(prompts, conts, strict=True)]
    t = max(map(len, seqs))
    pad = target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([[0] * len(p) + [1] * len(c) + [0] * (t - len(p) - len(c)) for p, c in zip(prompts, conts,
                                                                                                 strict=True)])
    return x, attn, lm, prompts, conts


def test_trained_drafter_is_accepted(tiny_targets):
    """A P-EAGLE drafter trained with peagle_forward on tiny:mistral's own continuations (not tiny:llama: its
    greedy output repeats one token) drafts accepted tokens beyond the first slot; a random one does not."""
    target = tiny_targets["mistral"]
    x, attn, lm, prompts, conts = own_continuations(target)
    drafter, points = peagle_drafter(target)
    store = capture(target.model, x, [*points, FINAL_NORM], attention_mask=attn)
    feats = torch.cat([store[p.name] for p in points], -1)
    head = target.model.get_output_embeddings().weight.detach()
    drafter.train()
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):  # a fixed step count: every machine gets the same drafter
        out = peagle_forward(drafter, feats, x, store[FINAL_NORM.name], head, lm, depths=3, attention_mask=attn,
                             generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses
    drafter.eval()
    rand, _ = peagle_drafter(target, seed=1)
    got = {"trained": [], "random": []}
    for ids, ref in zip(prompts, conts, strict=True):  # the same greedy continuations, the lossless reference
        for name, d in (("trained", drafter), ("random", rand)):
            res = generate_parallel(target, d, points, ids, MAX_NEW, k=3)
            assert res.tokens == ref, name
            got[name].append(res.accepted_per_pos())
    per_pos = {k: [sum(c) for c in zip(*v, strict=False)] for k, v in got.items()}
    # positions 1 and 2 are drafted by the mask slots: accepted there, the parallel slots learned (23/15/9 here)
    assert per_pos["trained"][1] >= 4 and per_pos["trained"][2] > 0, per_pos
    assert per_pos["trained"][0] > per_pos["random"][0] + 4, per_pos
