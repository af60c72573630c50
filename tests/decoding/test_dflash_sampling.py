"""DFlash block decoding with sampling: the emitted tokens follow the target's own (warped) distribution.

The rule is the engine's one (verify.py); what is DFlash's own is that a block's K drafts come from one
forward, slot k drawn from its own p_k, and each slot must be verified with the p it was drawn from. The
synthetic test pins that with distributions chosen so that each planted bug moves P(first token) by
>= 0.06 (over eight standard errors at 2,000 trials; chi-square p < 1e-70); the end-to-end test runs the engine on a tiny target.
Reference distributions are exact (enumerated), compared by chi-square (test_sampling's helpers).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_sampling import chi2_pvalue

from conftest import PROMPTS, greedy_reference
from eaglewire.decoding import dflash as block_decoding
from eaglewire.decoding import verify as verify_mod
from eaglewire.decoding.dflash import BlockEngine, verify_block
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.verify import warp
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.training.dflash_loss import dflash_forward

pytestmark = pytest.mark.unit

# target: q at the root, then q after the first token a (a distribution rolled by a)
Q0 = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])
Q1 = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])
# two slots of one block, drawn independently, far apart: verifying with the wrong one is visible
P1 = torch.tensor([0.7, 0.05, 0.05, 0.1, 0.1])
P2 = torch.tensor([0.05, 0.05, 0.1, 0.1, 0.7])


def _q(prefix: tuple) -> torch.Tensor:
    return Q0 if not prefix else Q1.roll(prefix[-1] * (len(prefix) + 1))


def _rolled_slots(root, drafts, probs):
    """Planted bug: slot k verified with slot k+1's distribution (drafts still drawn from their own)."""
    probs = list(probs or [])
    return block_decoding.DraftTree(root=root, tokens=list(drafts), parents=list(range(len(drafts))),
                                    probs=probs[1:] + probs[:1])


def _abs_residual(q, x, p):
    """Planted bug: the residual without max(0, .): |q - p| renormalised (the only sampleable reading)."""
    r = (q - p).abs()
    return r / r.sum()


def _target_residual(q, x, p):
    """Planted bug: no residual at all: after a rejection the correction is drawn from q itself."""
    return q


BUGS = {"slot k verified with slot k+1's p": ("chain", _rolled_slots),
        "residual |q - p| (no max(0, .))": ("reject", _abs_residual),
        "correction drawn from q (no residual)": ("reject", _target_residual)}


@pytest.mark.parametrize("rule", ["ours", *BUGS])
def test_block_rejection_rule_and_negative_controls(monkeypatch, rule):
    """The joint law of the first two emitted tokens equals q0(a) q(b | a); every planted bug is rejected."""
    if rule != "ours":
        where, fn = BUGS[rule]
        monkeypatch.setattr(*((block_decoding, "chain_tree") if where == "chain" else (verify_mod, "_reject")), fn)
    gen = torch.Generator().manual_seed(0)
    n, counts = 2000, {}
    for _ in range(n):
        drafts = [int(torch.multinomial(p, 1, generator=gen)) for p in (P1, P2)]  # one block: independent draws

        def rows(i, drafts=drafts):
            return _q(tuple(drafts[:i])).log()

        acc, bonus = verify_block(0, drafts, [P1, P2], rows, 1.0, 1.0, gen)
        out = [*drafts[:acc], bonus]
        if len(out) < 2:  # the next round samples from the target at the new prefix
            out.append(int(torch.multinomial(_q(tuple(out)), 1, generator=gen)))
        counts[tuple(out[:2])] = counts.get(tuple(out[:2]), 0) + 1
    exact = {(a, b): float(Q0[a] * _q((a,))[b]) for a, b in itertools.product(range(5), range(5))}
    pval = chi2_pvalue(counts, exact, n)
    if rule == "ours":
        assert pval > 1e-3
    else:
        assert pval < 1e-6, f"the test failed to reject a wrong rule ({rule}): p = {pval}"


@pytest.fixture(scope="module")
def llama_block(tiny_targets):
    """(target, a DFlash drafter, blocks of 4, briefly trained on tiny:llama's own greedy text): drafts get accepted.

    A random drafter's samples almost never land in the target's nucleus, which would leave the verify
    of drafts untested; 20 fixed steps make it accept about one draft in ten at temperature 0.3."""
    target = tiny_targets["llama"]
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    seqs, masks = [], []
    for p in PROMPTS[:4]:
        ids = _encode(target, p)
        cont = greedy_reference(target, ids, 24)
        seqs.append(ids + cont)
        masks.append([0] * len(ids) + [1] * len(cont))
    t, pad = max(map(len, seqs)), target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([m + [0] * (t - len(m)) for m in masks])
    store = capture(target.model, x, cfg.points, attention_mask=attn)
    feats = torch.cat([store[p.name] for p in cfg.points], -1)
    embed = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(0)
    drafter.train()
    for _ in range(20):  # fixed steps: every machine gets the same drafter
        out = dflash_forward(drafter, feats, x, embed, head, lm, num_anchors=8, attention_mask=attn, generator=gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return target, drafter.eval()


def _encode(target, text: str) -> list[int]:
    from eaglewire.targets.chat import encode, render

    return encode(target.tokenizer, render(target.tokenizer, [{"role": "user", "content": text}], True))


def exact_marginals(target, prompt: list[int], depth: int, temp: float, top_p: float) -> list[dict]:
    """test_sampling's ``_exact_marginals`` (prefixes enumerated) with each depth's prefixes in one batched forward:
    they all have the same length, so no padding (about 3x faster here)."""
    eos = set(target.eos_ids())
    joint, marg = {(): 1.0}, []
    for _ in range(depth):
        nxt, m = {}, {}
        live = [pre for pre in joint if not (pre and pre[-1] in eos)]
        for pre in set(joint) - set(live):  # generation stopped: no further token
            m[None] = m.get(None, 0.0) + joint[pre]
        with torch.no_grad():
            logits = target.model(torch.tensor([prompt + list(pre) for pre in live])).logits[:, -1]  # [N, V]
        for pre, q in zip(live, warp(logits, temp, top_p), strict=True):
            for tok in torch.nonzero(q).flatten().tolist():
                nxt[(*pre, tok)] = joint[pre] * float(q[tok])
                m[tok] = m.get(tok, 0.0) + joint[pre] * float(q[tok])
        joint = nxt
        marg.append(m)
    return marg


TEMP, TOP_P, N = 0.3, 0.6, 200


@pytest.fixture(scope="module")
def peaked(llama_block):
    """(prompt ids, exact marginals of the first 3 sampled tokens) in a context where the random target is peaked."""
    target, _ = llama_block
    ids = _encode(target, PROMPTS[4])
    ids = ids + greedy_reference(target, ids, 16)
    return ids, exact_marginals(target, ids, 3, TEMP, TOP_P)


def test_engine_block_sampling_lossless(llama_block, peaked):
    """Marginals of the 2nd and 3rd tokens, decided by verifying slots 1 and 2 of one block, match the target's.

    The planted bugs are caught by the synthetic test above, where the slots' distributions are chosen far
    apart; this drafter's slots agree too often for a wrong slot's p to move these marginals reliably."""
    target, drafter = llama_block
    ids, exact = peaked
    counts = sampled_marginals(BlockEngine(target, drafter), ids, TEMP, TOP_P, N, 4)
    for i in (1, 2):
        assert chi2_pvalue(counts[i], exact[i], N) > 1e-3, i


def sampled_marginals(eng, ids: list[int], temp: float, top_p: float, n: int, max_new: int) -> list[dict]:
    """Counts of the first 3 emitted tokens over n seeds (None: generation stopped); the round after the prefill
    must draft 3 and accept at drafts 1 and 2 in some seed, so both drafts' verify is exercised, not only bonuses."""
    counts, per_pos = [{}, {}, {}], [0, 0]
    for seed in range(n):
        r = eng.generate(ids, SpecConfig(mode="chain", depth=3, temperature=temp, top_p=top_p, max_new_tokens=max_new,
                                         seed=seed))
        out = r.token_ids + [None] * (3 - len(r.token_ids))
        for i in range(3):
            counts[i][out[i]] = counts[i].get(out[i], 0) + 1
        first = r.metrics.steps[0]  # the round after the prefill drafts all 3 (vLLM's count), keeps 3 tokens
        assert first.drafted == 3
        per_pos = [c + (first.accepted > j) for j, c in enumerate(per_pos)]
    assert per_pos[0] > 0 and per_pos[1] > 0, per_pos
    return counts


def test_sampled_drafts_come_from_each_slots_own_distribution(llama_block, monkeypatch):
    """What the verify is handed: slot k's p_k = warp(slot logits k) and a draft drawn from it (not the argmax)."""
    target, drafter = llama_block
    seen = []
    real = block_decoding.verify_block

    def spy(root, drafts, probs, rows, temperature, top_p, gen):
        if drafts:  # a last round with no room to draft verifies the root alone
            seen.append((drafts, probs))
        return real(root, drafts, probs, rows, temperature, top_p, gen)

    monkeypatch.setattr(block_decoding, "verify_block", spy)
    logits_seen = []
    real_logits = block_decoding.BlockDrafter.slot_logits

    def logits_spy(self, bonus, k):
        z = real_logits(self, bonus, k)
        logits_seen.append(z)
        return z

    monkeypatch.setattr(block_decoding.BlockDrafter, "slot_logits", logits_spy)
    eng = BlockEngine(target, drafter)
    ids = _encode(target, PROMPTS[1])
    differ = 0
    for seed in range(5):
        eng.generate(ids, SpecConfig(mode="chain", depth=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=seed))
    assert len(seen) == len(logits_seen) >= 5
    for (drafts, probs), z in zip(seen, logits_seen, strict=True):
        assert len(probs) == len(drafts) == z.shape[0]
        for k, (d, p) in enumerate(zip(drafts, probs, strict=True)):
            torch.testing.assert_close(p, warp(z[k], 1.0, 0.9))
            assert p[d] > 0
            differ += d != int(z[k].argmax())
    assert differ > 0  # sampled, not greedy


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_greedy_block_equals_plain_generation(tiny_targets, arch):
    """Temperature 0: our plain decoding and transformers' greedy, token for token, at every depth."""
    target = tiny_targets[arch]
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4)
    torch.manual_seed(1)
    eng, plain = BlockEngine(target, DFlashDrafter(cfg).eval()), SpecEngine(target)
    for depth, text in zip((1, 2, 3), PROMPTS[5:8], strict=True):
        ids = _encode(target, text)
        want = plain.generate(ids, SpecConfig(mode="plain", max_new_tokens=12)).token_ids
        got = eng.generate(ids, SpecConfig(mode="chain", depth=depth, max_new_tokens=12))
        assert got.token_ids == want == greedy_reference(target, ids, 12), (depth, text)
        assert all(s.drafted <= depth for s in got.metrics.steps)


def test_depth_beyond_the_block_is_refused(tiny_targets):
    target = tiny_targets["llama"]
    cfg = DFlashConfig.from_target_config(target.config, mask_token_id=target.vocab_size - 1, block_size=4)
    eng = BlockEngine(target, DFlashDrafter(cfg).eval())
    with pytest.raises(EaglewireError, match=r"--depth 4: a DFlash drafter with block_size 4 drafts 1\.\.3 tokens"):
        eng.generate([1, 2, 3], SpecConfig(mode="chain", depth=4, max_new_tokens=4))
