"""Per-category acceptance on the shipped held-out prompts: categories found again from the samples' tokens."""

from __future__ import annotations

import torch

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.jsonl import read_jsonl
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.doctor.heldout import per_category, shipped_categories


class _Samples:
    """Samples whose tokens are chat-templated prompts and an answer, as `data build` stores them."""

    def __init__(self, tokenizer, prompts: list[str]):
        self.items = []
        for p in prompts:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            ids = list(ids) + tokenizer.encode(" An answer of some words.", add_special_tokens=False)
            self.items.append({"input_ids": torch.tensor(ids)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_categories_come_back_from_the_tokens_and_other_prompts_give_none(tiny_targets):
    tok = tiny_targets["llama"].tokenizer
    rows = read_jsonl(heldout_prompts_path())
    pick = [rows[0], rows[7], rows[30], rows[53]]
    assert shipped_categories(_Samples(tok, [r["prompt"] for r in pick]), tok) == [r["category"] for r in pick]
    assert shipped_categories(_Samples(tok, [pick[0]["prompt"], "A prompt of my own."]), tok) is None


def test_per_category_is_chain_stats_on_each_categorys_samples(tiny_drafter, tiny_targets):
    from eaglewire.data.dataset import FeatureDataset
    from eaglewire.saved.checkpoint import load_checkpoint

    ckpt, data = tiny_drafter
    model, _ = load_checkpoint(ckpt)
    head = tiny_targets["llama"].model.get_output_embeddings().weight.detach().float()
    ds = FeatureDataset(data, verify=False)
    cats = ["a" if i % 3 else "b" for i in range(len(ds))]
    per = per_category(model, ds, head, 3, cats)
    want_b = chain_stats(model, ds, head, len(ds), 3, indices=[i for i in range(len(ds)) if i % 3 == 0])
    assert per["b"]["mean_acceptance_length"] == want_b["mean_acceptance_length"]
    assert per["a"]["samples"] + per["b"]["samples"] == len(ds)
    # all samples: the round-weighted mix of the two categories
    both = chain_stats(model, ds, head, len(ds), 3)
    lo, hi = sorted(v["mean_acceptance_length"] for v in per.values())
    assert lo <= both["mean_acceptance_length"] <= hi
