"""Acceptance per prompt category on a dataset built from the shipped held-out prompts.

`eaglewire data build --prompts <the shipped held-out set>` keeps the prompts
but not their categories; each sample's category is found again by its
prompt's text inside the sample's tokens, so any dataset of those prompts
(whatever answer length or target) gets the per-category figures.
"""

from __future__ import annotations

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.jsonl import read_jsonl
from eaglewire.decoding.acceptance import chain_stats


def shipped_categories(ds: FeatureDataset, tokenizer) -> list[str] | None:
    """Each sample's category when every sample answers exactly one shipped held-out prompt, else None."""
    cats = {r["prompt"]: r["category"] for r in read_jsonl(heldout_prompts_path())}
    out = []
    for i in range(len(ds)):
        text = tokenizer.decode(ds[i]["input_ids"].tolist())
        hit = [c for p, c in cats.items() if p in text]
        if len(hit) != 1:
            return None
        out.append(hit[0])
    return out


def per_category(model, ds: FeatureDataset, head_w: torch.Tensor, depth: int, cats: list[str]) -> dict[str, dict]:
    """Mean acceptance length (as vLLM counts it) and its interval for each category's samples."""
    out = {}
    for c in sorted(set(cats)):
        idx = [i for i, x in enumerate(cats) if x == c]
        s = chain_stats(model, ds, head_w, len(idx), depth, indices=idx)
        out[c] = {"samples": len(idx), "mean_acceptance_length": s["mean_acceptance_length"],
                  "ci95": s["mean_acceptance_length_ci95"], "rounds": s["rounds"]}
    return out
