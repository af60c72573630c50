"""`doctor online`: what the drafter receives at inference vs what it saw in training.

Runs our engine (greedy) on the prompts of dataset samples, records the
feature rows handed to the drafter, and compares them with the stored
training features for the same tokens (the prompt and the part of the answer
that the greedy decode reproduces). When they differ it names what the
engine fed instead, by matching against every capture point of the target.
Then it compares the online tau with the offline prediction of
`doctor drafter`: wiring bugs show up as a big gap between the two.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset
from eaglewire.decoding.acceptance import chain_stats
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.doctor.dataset import MATCH_REL_ERR, all_points, dataset_tolerance
from eaglewire.doctor.verdict import Report
from eaglewire.infra.device import dtype_name
from eaglewire.saved.depth import DEPTH
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.capture import capture
from eaglewire.targets.points import parse_points


def _record_features(engine) -> list[torch.Tensor]:
    rows: list[torch.Tensor] = []
    orig = engine.draft.extend

    def extend(next_tokens, feats):
        rows.append(feats[0].detach().float().cpu())  # [T, A*Ht]
        return orig(next_tokens, feats)

    engine.draft.extend = extend
    return rows


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def _name_slot(target, ids: torch.Tensor, online: torch.Tensor, tol: float = MATCH_REL_ERR) -> str | None:
    pts = all_points(target.num_layers)
    ref = capture(target.model, ids[None].to(target.device), pts)
    errs = {p.name: _rel(online, ref[p.name][0].cpu()) for p in pts}
    best = min(errs, key=errs.get)
    return best if errs[best] < tol else None


def compare_sample(engine, target, item: dict, max_new_tokens: int, mode: str, depth: int = DEPTH):
    ids, mask = item["input_ids"], item["loss_mask"]
    a = int(mask.float().argmax()) if bool(mask.any()) else len(ids)
    rows = _record_features(engine)
    # min_prob=0: every round drafts to full depth, as the offline tau it is compared with assumes
    res = engine.generate(ids[:a].tolist(), SpecConfig(mode=mode, max_new_tokens=max_new_tokens, temperature=0.0,
                                                       min_prob=0.0, depth=depth))
    gen = torch.tensor(res.token_ids)
    ref = ids[a:a + len(gen)]
    m = int((torch.cumprod((gen[: len(ref)] == ref).long(), 0)).sum())
    online = torch.cat(rows)  # [k, A*Ht] rows for positions 0..k-1
    n = min(len(online), a + m - 1)
    P, H = item["features"].shape[1:]
    stored = item["features"][:n].float()  # [n, P, H]
    got = online[:n].view(n, P, H)
    slots = [_rel(got[:, j], stored[:, j]) for j in range(P)]
    return res, slots, got, ids[:n]


def doctor_online(target, drafter, prov: Provenance, data_dir: Path, serve_points=None, num_samples: int = 4,
                  max_new_tokens: int = 48, depth: int = DEPTH) -> Report:
    rep = Report("online")
    ds = FeatureDataset(data_dir, verify=False, check_order=False)
    # the engine's forward runs in the target's dtype: its allowance joins the dataset's
    tol = dataset_tolerance(ds.manifest, ds, num_samples, also=dtype_name(target.dtype))["tolerance"]
    trained = parse_points(prov.point_names or [], target.num_layers)
    served = serve_points or trained
    engine = SpecEngine(target, drafter, points=served)
    total = None
    worst = [0.0] * len(trained)
    named: dict[int, str | None] = {}
    for i in range(min(num_samples, len(ds))):
        res, slots, got, ids = compare_sample(engine, target, ds[i], max_new_tokens, "chain", depth)
        worst = [max(w, s) for w, s in zip(worst, slots)]
        for j, s in enumerate(slots):
            if s >= tol and j not in named:
                named[j] = _name_slot(target, ids, got[:, j], tol)
        total = res.metrics if total is None else (total.add(res.metrics) or total)
    for j, w in enumerate(worst):
        ok = w < tol
        rep.add(f"slot {j}", ok, f"online vs training rel err {w:.1e}" + ("" if ok else
                f": the engine feeds {named.get(j) or 'an unidentified tensor'} where training used {trained[j].name}"),
                f"serve with ids that capture {trained[j].name} (see `eaglewire layers` / `doctor config`)")
    head = target.model.get_output_embeddings().weight.detach().float()
    off = chain_stats(drafter, ds, head, num_samples, depth)
    tau = total.tau if total is not None else None
    pred = off["mean_acceptance_length"]  # rounds as decoding takes them: what the engine's tau counts
    rep.data.update(online_tau=tau, offline_tau=pred, depth=depth, served=[p.name for p in served],
                    trained=[p.name for p in trained], slot_rel_err=worst, tolerance=tol)
    close = tau is not None and tau >= 0.75 * pred
    cause = "" if close else (" - features differ from training: a wiring bug" if any(w >= tol for w in worst)
                              else " - features match: check the chat template, sampling settings or drafter dtype")
    rep.add("tau", close, f"served chain depth {depth}, ungated: mean acceptance length {tau if tau is None else round(tau, 2)} "
            f"(1 + accepted per round) vs {pred:.2f} predicted offline on these samples' stored answers{cause}",
            "fix the failing slots above" if cause.startswith(" - features differ") else "")
    return rep
