"""`doctor dataset`: which physical target tensor does each stored feature slot hold?

Labels can be wrong (the seeds' dataset said slot 0 was the embedding while
it held a layer output) or missing (foreign datasets). So the doctor ignores
them: it recomputes every capture point of the target for a few samples and
matches each slot by relative error. Adjacent residual-stream layers have
cosine ~0.99 with each other, so relative error (not cosine) decides, and the
runner-up margin is reported so a near-tie is visible.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..capture import capture
from ..data.dataset import FeatureDataset
from ..data.manifest import read_manifest, shard_problem
from ..points import EMBED, FINAL_NORM, Point, id_lists, layer_out
from ..targets import fingerprint_mismatch, target_fingerprint
from .verdict import Report

MATCH_REL_ERR = 0.05  # bf16 storage gives ~4e-3; a neighbouring layer gives >0.1


def all_points(num_layers: int) -> list[Point]:
    return [EMBED] + [layer_out(k) for k in range(num_layers)] + [FINAL_NORM]


@torch.no_grad()
def identify_slots(target, ds: FeatureDataset, num_samples: int = 4) -> tuple[list[dict], dict]:
    """Per slot: best matching point with rel. error, cosine and runner-up; plus the target_hidden match."""
    pts = all_points(target.num_layers)
    n = min(num_samples, len(ds))
    P = ds[0]["features"].shape[1]
    num = torch.zeros(P + 1, len(pts), dtype=torch.float64)  # squared error sums; row P = target_hidden
    den = torch.zeros(len(pts), dtype=torch.float64)
    dots = torch.zeros(P + 1, len(pts), dtype=torch.float64)
    fnorm = torch.zeros(P + 1, dtype=torch.float64)
    for i in range(n):
        item = ds[i]
        ref = capture(target.model, item["input_ids"][None].to(target.device), pts)
        stored = torch.cat([item["features"], item["target_hidden"][:, None]], dim=1).double()  # [T, P+1, H]
        for c, p in enumerate(pts):
            r = ref[p.name][0].double().cpu()  # [T, H]
            den[c] += (r * r).sum()
            num[:, c] += ((stored - r[:, None]) ** 2).sum(dim=(0, 2))
            dots[:, c] += (stored * r[:, None]).sum(dim=(0, 2))
        fnorm += (stored ** 2).sum(dim=(0, 2))
    rel = (num / den.clamp(min=1e-30)).sqrt()  # [P+1, C]
    cos = dots / (fnorm[:, None].sqrt() * den.sqrt()[None]).clamp(min=1e-30)
    rows = []
    for j in range(P + 1):
        order = rel[j].argsort()
        best, second = int(order[0]), int(order[1])
        rows.append({"slot": j if j < P else "target_hidden", "point": pts[best].name if rel[j, best] < MATCH_REL_ERR else None,
                     "best": pts[best].name, "rel_err": float(rel[j, best]), "cosine": float(cos[j, best]),
                     "runner_up": pts[second].name, "runner_up_rel_err": float(rel[j, second])})
    return rows[:P], rows[P]


def doctor_dataset(data_dir, target, num_samples: int = 4) -> Report:
    rep = Report("dataset")
    man = read_manifest(data_dir)
    L = target.num_layers
    fp = man["target"].get("fingerprint") or {}
    diff = [] if fp.get("unknown") else fingerprint_mismatch(fp, target_fingerprint(target))
    rep.add("target", not diff, "dataset made from this target" if not diff else f"fingerprint differs in {', '.join(diff)}",
            "pass the target the dataset was made from (--target); if it is that target, the manifest was edited")
    bad = [(e["file"], why) for e in man["shards"] if (why := shard_problem(Path(data_dir), e))]
    rep.add("shards", not bad, f"{len(man['shards'])} shards match their manifest checksums" if not bad else
            "; ".join(f"{f}: {why}" for f, why in bad),
            f"run `eaglewire data extract {data_dir} --resume` (bad or missing shards are re-extracted)")
    if bad:  # features from corrupt shards would be misread as a wiring problem
        return rep
    ds = FeatureDataset(data_dir, verify=False)
    slots, th = identify_slots(target, ds, num_samples)
    labels = man["points"].get("names") or [None] * len(slots)
    found = []
    for s, label in zip(slots, labels):
        found.append(s["point"])
        if s["point"] is None:
            rep.add(f"slot {s['slot']}", False, f"matches no target tensor (closest {s['best']}, rel err {s['rel_err']:.3f})",
                    "the features were not captured from this target (or are corrupt)")
        elif label is None:
            rep.add(f"slot {s['slot']}", True, f"holds {s['point']} (rel err {s['rel_err']:.1e}); manifest has no label",
                    level="warning")
        else:
            ok = label == s["point"]
            rep.add(f"slot {s['slot']}", ok,
                    f"holds {s['point']} (rel err {s['rel_err']:.1e}, next {s['runner_up']} {s['runner_up_rel_err']:.2f})"
                    + ("" if ok else f" but the manifest says {label}"),
                    f"relabel slot {s['slot']} as {s['point']} (train and serve with ids for {s['point']})")
    rep.add("target_hidden", th["point"] == FINAL_NORM.name,
            f"holds {th['best']} (rel err {th['rel_err']:.1e})",
            "target_hidden must be the final-norm output (what the lm_head sees)")
    ident = [p for p in found if p is not None]
    if len(ident) == len(found):
        rep.data["identified"] = id_lists([Point.parse(p) for p in ident], L)
    rep.data.update(slots=slots, target_hidden=th, manifest_points=man["points"], num_samples=min(num_samples, len(ds)))
    return rep
