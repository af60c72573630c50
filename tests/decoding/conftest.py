"""Fixtures for speculative decoding tests: random and briefly trained tiny drafters."""

from __future__ import annotations

import pytest
import torch

from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.targets.points import FINAL_NORM, eagle3_default

ARCHS = ["llama", "qwen3", "mistral", "deepseek_v3"]
PROMPTS = [
    "Hello, how are you today?",
    "Write a short story about a robot.",
    "Explain why the sky is blue.",
    "What is 12 plus 30?",
    "Give me three ideas for a birthday party.",
    "Please write a Python function that adds two numbers.",
    "Can you help me plan a trip to the mountains?",
    "Translate this sentence into French.",
    "Summarize the following text in one sentence.",
    "Once upon a time there was a small village.",
    "The quick brown fox",
    "Thank you for your help!",
]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Run the spec tests single-threaded: on the shared 2-core machine an OpenMP
    thread that loses its core makes every small op wait a scheduler quantum
    (~12 ms), which made these tests 4x slower; tiny models gain nothing from 2."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cat_kv(a, b):
    """Per layer, K/V ``[B, Hk, P, D]`` and ``[B, Hk, T, D]`` concatenated: the naive cache the references keep."""
    if a is None:
        return b
    return [(torch.cat([ak, bk], 2), torch.cat([av, bv], 2)) for (ak, av), (bk, bv) in zip(a, b, strict=True)]


def random_drafter(target, seed: int = 0, draft_vocab: int | None = None) -> Eagle3Drafter:
    """A random drafter wired to ``target`` with a reduced, non-identity draft vocab."""
    v = target.vocab_size
    d = draft_vocab or (3 * v) // 4
    cfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=d)
    torch.manual_seed(seed)
    model = Eagle3Drafter(cfg)
    model.load_target_embedding(target.model.get_input_embeddings().weight)
    g = torch.Generator().manual_seed(seed)
    model.set_draft_vocab(torch.sort(torch.randperm(v, generator=g)[:d]).values)
    return model.eval()


def greedy_reference(target, prompt_ids: list[int], max_new: int) -> list[int]:
    """The target's own greedy continuation (transformers generate)."""
    x = torch.tensor([prompt_ids])
    out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                max_new_tokens=max_new, eos_token_id=target.eos_ids(),
                                pad_token_id=target.eos_ids()[0])
    return out[0, x.shape[1]:].tolist()


def train_drafter(target, steps: int = 80, seed: int = 0, n_prompts: int = 8):
    """Briefly train a drafter on the target's own greedy continuations (TTT).

    A fixed number of steps, not a time budget: a slower machine must get the same drafter.
    """
    from eaglewire.drafter.ttt import ttt_forward
    from eaglewire.targets.capture import capturing
    from eaglewire.targets.chat import encode, render

    tok = target.tokenizer
    seqs, masks = [], []
    for p in PROMPTS[:n_prompts]:
        ids = encode(tok, render(tok, [{"role": "user", "content": p}], True))
        cont = greedy_reference(target, ids, 40)
        seqs.append(ids + cont)
        masks.append([0] * len(ids) + [1] * len(cont))
    t = max(len(s) for s in seqs)
    pad = target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([m + [0] * (t - len(m)) for m in masks])
    points = eagle3_default(target.num_layers)
    with capturing(target.model, [*points, FINAL_NORM]) as store, torch.no_grad():
        target.model.model(input_ids=x, attention_mask=attn, use_cache=False)
    feats = torch.cat([store[p.name] for p in points], -1)
    hidden = store[FINAL_NORM.name]
    head = target.model.get_output_embeddings().weight.detach()
    # draft vocab: the most frequent generated tokens (ascending ids), padded with others
    counts = torch.bincount(x[lm.bool()], minlength=target.vocab_size).float()
    d = (3 * target.vocab_size) // 4
    vocab = torch.sort(counts.topk(d).indices).values
    model = random_drafter(target, seed, d)
    model.set_draft_vocab(vocab)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95))
    for _ in range(steps):
        out = ttt_forward(model, feats, x, hidden, head, loss_mask=lm, attention_mask=attn, steps=3)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return model.eval(), points


@pytest.fixture(scope="session")
def trained_drafters(tiny_targets):
    return {a: train_drafter(tiny_targets[a]) for a in ARCHS}
