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
    accept_lengths, rounds = [], []
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
        served, walk = round_masks(b, depth)
        run_served = torch.cumprod((hit & served).long(), dim=-1).sum(-1)  # [B, T]
        for r_b, s_b in zip(run_served, walk):
            rounds.append(decode_rounds(r_b, s_b))
    acc = (correct / count.clamp(min=1)).tolist()
    hist = torch.bincount(torch.tensor(accept_lengths or [0]), minlength=depth + 1).tolist()
    tau = 1.0 + (sum(accept_lengths) / len(accept_lengths) if accept_lengths else 0.0)
    flat = [r for per in rounds for r in per]
    n_r = max(len(flat), 1)
    return {"acc": acc, "tau_chain": tau, "depth": depth, "accept_hist": hist, "positions": len(accept_lengths),
            "samples": len(idx),
            # as vLLM reports a served drafter: 1 + accepted per verify round, rounds taken as decoding takes them
            "mean_acceptance_length": 1.0 + sum(flat) / n_r, "rounds": len(flat),
            "mean_acceptance_length_ci95": bootstrap_interval(rounds),
            "accepted_per_position": [sum(r > k for r in flat) for k in range(depth)],
            "acceptance_rate_per_position": [sum(r > k for r in flat) / n_r for k in range(depth)]}


def bootstrap_interval(rounds: list[list[int]], n_boot: int = 1000, seed: int = 0) -> list[float] | None:
    """95% interval of the mean acceptance length, resampling whole samples (None below 2 samples).

    Rounds of one answer are correlated (an easy answer accepts a lot
    throughout), so the answer, not the round, is the unit resampled: with a
    handful of samples the interval is honestly wide.
    """
    per = [(sum(r), len(r)) for r in rounds if r]
    if len(per) < 2:
        return None
    acc = torch.tensor([a for a, _ in per], dtype=torch.float64)
    cnt = torch.tensor([n for _, n in per], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(per), (n_boot, len(per)), generator=g)
    means = 1.0 + acc[pick].sum(1) / cnt[pick].sum(1)
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [lo, hi]


def round_masks(batch: dict, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft k of the round at t drafts an answer token [B, T, depth], a round starts at t [B, T]).

    Decoding stops once it has emitted the answer's last token (its end of
    turn, or the token budget), so a round exists only while the token it
    drafts first is still part of the answer, and a draft past the end is
    never accepted. (`acc` and `tau_chain` keep the per-position convention
    of SpecForge and EAGLE-3, which scores the position after the last token too.)
    """
    valid = (batch["loss_mask"] & batch["attention_mask"]).long()  # [B, T]
    drafted = torch.stack([_shift_left(valid, 2 + k).bool() for k in range(depth)], -1)  # [B, T, depth]
    return drafted, drafted[..., 0] & _shift_left(valid, 1).bool()


def decode_rounds(run: torch.Tensor, start: torch.Tensor) -> list[int]:
    """Accepted drafts per round as greedy chain decoding meets them along one sample.

    `run[t]` is the accept length of a round whose known tokens end at t + 1
    (its depth-0 draft is token t + 2); `start[t]` says token t + 1 is an
    answer token, so the first start of an answer is the round right after
    the prefill's token. A round that accepts r drafts moves decoding r + 1
    tokens on (the bonus token): positions inside an accepted run are never
    round starts. Averaging over every position instead would over-weight
    the easy stretches a good drafter skips over.
    """
    s, T, t, out = start.tolist(), len(start), 0, []
    while t < T:
        if s[t]:
            r = int(run[t])
            out.append(r)
            t += r + 1
        else:
            t += 1
    return out


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


MIN_SAMPLES = 16  # fewer answers than this give an interval too wide to predict serving from
MAX_HALF_WIDTH = 0.15


def _add_acceptance(rep: Report, good: dict, depth: int) -> None:
    """The offline acceptance length, labelled with what it counts and how sure it is."""
    mal, ci, n = good["mean_acceptance_length"], good["mean_acceptance_length_ci95"], good["samples"]
    span = f"95% interval {ci[0]:.2f}-{ci[1]:.2f}" if ci else "no interval from one sample"
    rep.add("offline acceptance", mal >= 1.3,
            f"chain depth {depth}, ungated: mean acceptance length {mal:.2f} (1 + accepted per round, as vLLM counts "
            f"it; {good['rounds']} rounds over {n} samples, {span}); serving chain decoding at this depth with "
            "--min-prob 0 should reach about this",
            "near 1 means every draft is rejected: a wiring or training problem", level="warning")
    if n < MIN_SAMPLES or ci is None or (ci[1] - ci[0]) / 2 > MAX_HALF_WIDTH:
        rep.add("sample size", False, f"{n} samples give {span}: too few to predict serving",
                f"evaluate on at least {MIN_SAMPLES} samples (--samples, or a dataset with more held-out answers)",
                level="warning")


def _add_categories(rep: Report, model, ds, head_w, depth: int, tokenizer) -> None:
    from eaglewire.doctor.heldout import per_category, shipped_categories

    cats = shipped_categories(ds, tokenizer)
    if cats is None:
        rep.data["per_category"] = None  # a dataset of other prompts: no category to report, nothing wrong
        return
    per = per_category(model, ds, head_w, depth, cats)
    rep.data["per_category"] = per
    rep.add("per category", True, "shipped held-out prompts, mean acceptance length: " + ", ".join(
        f"{c} {v['mean_acceptance_length']:.2f}" for c, v in sorted(per.items(), key=lambda kv: -kv[1]["mean_acceptance_length"])))


def doctor_drafter(model, prov: Provenance, data_dir, head_w: torch.Tensor, num_samples: int = 64, depth: int = 4,
                   tokenizer=None) -> Report:
    """`tokenizer`: when given and the dataset answers the shipped held-out prompts, also per category."""
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
    _add_acceptance(rep, good, depth)
    if tokenizer is not None and idx == list(range(len(ds))) and num_samples >= len(ds):
        _add_categories(rep, model, ds, head_w, depth, tokenizer)
    d2t_nonzero = bool((model.d2t != 0).any())
    if d2t_nonzero and as_ids["acc"][0] > good["acc"][0] + 0.1:
        rep.add("d2t", False, f"acc_0 {good['acc'][0]:.3f} with d2t as offsets but {as_ids['acc'][0]:.3f} as absolute ids: "
                "this checkpoint stores absolute target ids in d2t", "rewrite d2t as offsets: d2t[i] = target_id[i] - i")
    else:
        rep.add("d2t", True, f"offsets (acc_0 {good['acc'][0]:.3f}); an engine reading d2t as absolute ids would get "
                f"acc_0 {as_ids['acc'][0]:.3f}" if d2t_nonzero else "identity (full vocab)")
    return rep
