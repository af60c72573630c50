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

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.manifest import manifest_hash
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.doctor.heldout import per_category, shipped_categories
from eaglewire.doctor.verdict import Report
from eaglewire.drafter.vocabmap import duplicate_target
from eaglewire.saved.depth import DEPTH
from eaglewire.saved.provenance import Provenance


def heldout_indices(prov: Provenance, data_dir, ds) -> tuple[list[int], str, bool]:
    """Samples to evaluate, a sentence saying which split that is, and whether the drafter never trained on them."""
    split = prov.split or {}
    trained_sha = prov.manifest_sha
    if trained_sha is None or trained_sha != manifest_hash(data_dir):
        return list(range(len(ds))), "all samples (a dataset other than the training one)", True
    if split.get("val_indices") and split.get("num_samples") == len(ds):
        by = ((prov.training or {}).get("selected") or {}).get("by", "last")
        chosen = (f"; the checkpoint was selected by {by} on these samples, so expect a slightly optimistic figure "
                  "(a dataset of other prompts, such as the shipped held-out one, is unbiased)") if by != "last" else ""
        return (list(split["val_indices"]), f"the held-out validation split recorded in the run "
                f"({len(split['val_indices'])} samples){chosen}", True)
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
    cats = shipped_categories(ds, tokenizer)
    if cats is None:
        rep.data["per_category"] = None  # a dataset of other prompts: no category to report, nothing wrong
        return
    per = per_category(model, ds, head_w, depth, cats)
    rep.data["per_category"] = per
    rep.add("per category", True, "shipped held-out prompts, mean acceptance length: " + ", ".join(
        f"{c} {v['mean_acceptance_length']:.2f}" for c, v in sorted(per.items(), key=lambda kv: -kv[1]["mean_acceptance_length"])))


def doctor_drafter(model, prov: Provenance, data_dir, head_w: torch.Tensor, num_samples: int = 64, depth: int = DEPTH,
                   tokenizer=None) -> Report:
    """`tokenizer`: when given and the dataset answers the shipped held-out prompts, also per category."""
    rep = Report("drafter")
    ds = FeatureDataset(data_dir, verify=False, check_order=False)
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
    if (dup := duplicate_target(model.d2t.cpu())) is not None:
        rep.add("d2t", False, f"d2t maps two draft ids to target id {dup}: two draft logits stand for one token "
                "(llama.cpp refuses such a file, vLLM serves it wrongly)",
                "rebuild the draft vocabulary (`eaglewire data vocab`) and train again")
    elif d2t_nonzero and as_ids["acc"][0] > good["acc"][0] + 0.1:
        rep.add("d2t", False, f"acc_0 {good['acc'][0]:.3f} with d2t as offsets but {as_ids['acc'][0]:.3f} as absolute ids: "
                "this checkpoint stores absolute target ids in d2t", "rewrite d2t as offsets: d2t[i] = target_id[i] - i")
    else:
        rep.add("d2t", True, f"offsets (acc_0 {good['acc'][0]:.3f}); an engine reading d2t as absolute ids would get "
                f"acc_0 {as_ids['acc'][0]:.3f}" if d2t_nonzero else "identity (full vocab)")
    return rep
