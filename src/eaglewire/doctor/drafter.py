"""`doctor drafter`: the standalone test, run exactly as training ran.

Before anyone starts a server: per-TTT-step accuracy on dataset samples and
an offline chain-drafting tau. The chain simulation needs no engine: in a
chain draft the token fed at depth k is the drafter's own previous guess, and
while the guesses match the target (the only case that matters for the
accept length) that equals the ground-truth token that TTT feeds. So the
accept length at position t is the number of leading depths whose draft
argmax equals the target's argmax, read off one TTT-style unroll.

It also checks the d2t convention: accuracy with d2t read as offsets (right)
versus read as absolute ids (the seeds' 0%-accuracy deployment bug).
"""

from __future__ import annotations

import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.doctor.verdict import Report
from eaglewire.drafter.provenance import Provenance
from eaglewire.drafter.ttt import _shift_left, target_full_argmax, ttt_attention_mask


@torch.no_grad()
def unroll_predictions(model, batch: dict, head_w: torch.Tensor, depth: int):
    """Draft argmax (draft ids) per depth k at every position t, and the target argmax at t+1+k."""
    feats = batch["features"].float().flatten(2)  # [B, T, P*H]
    ids = batch["input_ids"]
    B, T = ids.shape
    tgt = target_full_argmax(batch["target_hidden"].float(), head_w)  # [B, T]
    valid = batch["loss_mask"] & batch["attention_mask"]  # [B, T]
    hidden = model.project(feats)
    cache, preds, targets, masks = None, [], [], []
    for k in range(depth):
        pos = torch.arange(T)[None] + k
        hidden, new_kv = model.step(_shift_left(ids, 1 + k), hidden, pos, cache, ttt_attention_mask(T, k))
        cache = new_kv if cache is None else [(torch.cat([a, c], 2), torch.cat([b, d], 2)) for (a, b), (c, d) in zip(cache, new_kv)]
        preds.append(model.logits(hidden).argmax(-1))  # [B, T] draft ids
        targets.append(_shift_left(tgt, 1 + k))
        masks.append(_shift_left(valid.long(), 1 + k).bool())
    return torch.stack(preds, -1), torch.stack(targets, -1), torch.stack(masks, -1)  # [B, T, depth]


def chain_stats(model, ds, head_w, num_samples: int, depth: int, d2t_mode: str = "offsets",
                indices: list[int] | None = None) -> dict:
    """acc per depth and offline chain tau (accept + 1 bonus) on ``indices`` (default: the first samples).

    acc_k's denominator is every loss position whose target exists (as SpecForge
    and official EAGLE-3 count it): a target token outside the draft vocab
    counts as a miss.
    """
    correct = torch.zeros(depth)
    count = torch.zeros(depth)
    accept_lengths = []
    idx = list(range(len(ds)) if indices is None else indices)[:num_samples]
    for i in range(0, len(idx), 4):
        b = collate([ds[j] for j in idx[i:i + 4]])
        pred, tgt, m = unroll_predictions(model, b, head_w, depth)
        mapped = pred + model.d2t[pred] if d2t_mode == "offsets" else model.d2t[pred]
        hit = (mapped == tgt) & m  # [B, T, depth]
        correct += hit.sum(dim=(0, 1)).float()
        count += m.sum(dim=(0, 1)).float()
        start = m[..., 0]  # positions where a draft round could start
        run = torch.cumprod(hit.long(), dim=-1).sum(-1)  # [B, T] leading matches
        accept_lengths += run[start].tolist()
    acc = (correct / count.clamp(min=1)).tolist()
    hist = torch.bincount(torch.tensor(accept_lengths or [0]), minlength=depth + 1).tolist()
    tau = 1.0 + (sum(accept_lengths) / len(accept_lengths) if accept_lengths else 0.0)
    return {"acc": acc, "tau_chain": tau, "depth": depth, "accept_hist": hist, "positions": len(accept_lengths),
            "samples": len(idx)}


def heldout_indices(prov: Provenance, data_dir, ds) -> tuple[list[int], str, bool]:
    """Samples to evaluate, a sentence saying which split that is, and whether the drafter never trained on them."""
    from eaglewire.data.manifest import manifest_hash

    split = prov.split or {}
    trained_sha = prov.manifest_sha
    if trained_sha is None or trained_sha != manifest_hash(data_dir):
        return list(range(len(ds))), "all samples (a dataset other than the training one)", True
    if split.get("val_indices") and split.get("num_samples") == len(ds):
        return list(split["val_indices"]), f"the held-out validation split recorded in the run ({len(split['val_indices'])} samples)", True
    return list(range(len(ds))), "TRAINING samples (the run records no held-out split): expect an optimistic tau", False


def doctor_drafter(model, prov: Provenance, data_dir, head_w: torch.Tensor, num_samples: int = 64, depth: int = 4) -> Report:
    rep = Report("drafter")
    ds = FeatureDataset(data_dir, verify=False)
    trained = prov.point_names
    stored = ds.manifest.point_names if ds.manifest.points is not None else None
    same = trained == stored
    rep.add("points", same or not trained or not stored,
            f"drafter trained on {trained}, dataset holds {stored}",
            "evaluate on a dataset captured at the drafter's points")
    idx, which, held_out = heldout_indices(prov, data_dir, ds)
    good = chain_stats(model, ds, head_w, num_samples, depth, "offsets", idx)
    as_ids = chain_stats(model, ds, head_w, num_samples, depth, "ids", idx)
    rep.data.update(offline=good, d2t_as_ids=as_ids, split=which)
    rep.add("split", held_out, f"evaluated on {which}",
            "train with --val-fraction > 0, or give a dataset the drafter never saw", level="warning")
    rep.add("accuracy", good["acc"][0] >= 0.2, "acc per depth " + " ".join(f"{a:.3f}" for a in good["acc"]),
            "the drafter predicts the target poorly: train longer, or check `doctor dataset` / the points")
    rep.add("offline tau", good["tau_chain"] >= 1.3,
            f"chain depth {depth}: tau {good['tau_chain']:.2f} (accepted+1 per verify step, {good['samples']} samples); "
            "serving chain decoding at this depth should reach about this",
            "tau near 1 means every draft is rejected: a wiring or training problem", level="warning")
    d2t_nonzero = bool((model.d2t != 0).any())
    if d2t_nonzero and as_ids["acc"][0] > good["acc"][0] + 0.1:
        rep.add("d2t", False, f"acc_0 {good['acc'][0]:.3f} with d2t as offsets but {as_ids['acc'][0]:.3f} as absolute ids: "
                "this checkpoint stores absolute target ids in d2t", "rewrite d2t as offsets: d2t[i] = target_id[i] - i")
    else:
        rep.add("d2t", True, f"offsets (acc_0 {good['acc'][0]:.3f}); an engine reading d2t as absolute ids would get "
                f"acc_0 {as_ids['acc'][0]:.3f}" if d2t_nonzero else "identity (full vocab)")
    return rep
