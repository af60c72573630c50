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

from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.manifest import Manifest, shard_problem
from eaglewire.doctor.verdict import Report
from eaglewire.infra.device import dtype_name
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.points import EMBED, FINAL_NORM, Point, id_lists, layer_out

# Unit roundoff u = 2^-p of each storage dtype (p = significand bits incl. the implicit one).
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
# Relative error of the forward pass that produced the features, vs the doctor's fp32 recompute.
COMPUTE_ALLOWANCE = {"fp32": 1e-3, "fp16": 8e-3, "bf16": 0.05}
ROUNDING_FACTOR = 4
# The loosest tolerance (bf16 storage of a bf16 forward). Not a separator of neighbours: the default
# target's middle layers differ by only ~0.02 (massive activations dominate the norm), so for half-precision
# data the argmin and the reported runner-up margin identify the slot, and the tolerance rejects foreign data.
MATCH_REL_ERR = ROUNDING_FACTOR * UNIT_ROUNDOFF["bf16"] + COMPUTE_ALLOWANCE["bf16"]


def match_tolerance(store_dtype: str, compute_dtype: str) -> float:
    """Largest relative RMS error at which a stored slot still *is* a recomputed tensor.

    Two independent error sources add up, so the tolerance follows both dtypes:
    - storage rounding: round-to-nearest moves each value by at most u of itself
      (fp32 2^-24, fp16 2^-11, bf16 2^-8), and the relative RMS over a tensor
      stays below u (measured on the default target's features: bf16 1.4-2.4e-3
      = 0.4-0.6 u, fp16 0.3-2.6e-4 <= 0.55 u); 4 u leaves room for unlucky tensors;
    - the forward that produced the features, against the doctor's fp32 recompute:
      fp32 on another batch shape or device differs by ~1e-6 (allowance 1e-3);
      an fp16 forward of the default target differs by up to 3.6e-3 (8e-3); a bf16
      forward by up to 4.8e-2 at its last layer (0.05, the value this doctor used
      for every dataset before). That term dominates half-precision forwards,
      so only a dataset known to come from an fp32 forward gets the tight fp32 bound.
    """
    return ROUNDING_FACTOR * UNIT_ROUNDOFF[store_dtype] + COMPUTE_ALLOWANCE[compute_dtype]


def _representable(x: torch.Tensor, dtype: torch.dtype) -> bool:
    x = x[torch.isfinite(x)].float()
    return bool((x.to(dtype).float() == x).all())


def forward_precision(man: Manifest, ds: FeatureDataset, num_samples: int) -> tuple[str, str, str]:
    """(stored dtype, dtype of the forward that produced the features, how that is known).

    The manifest may record the forward's dtype; otherwise the stored values tell
    what they can: a half-precision forward leaves values that are exact numbers of
    that dtype (an fp32 forward almost never does), visible unless bf16 storage
    rounded them all to bf16 anyway.
    """
    feats = [ds[i]["features"] for i in range(min(num_samples, len(ds)))]
    store = dtype_name(feats[0].dtype)
    if store is None:
        raise EaglewireError(f"{ds.root}: features stored as {feats[0].dtype}, expected fp32, bf16 or fp16")
    recorded = man.forward_dtype
    if recorded in COMPUTE_ALLOWANCE:
        return store, recorded, "recorded in the manifest"
    if store == "bf16":
        return store, "bf16", "unknown (bf16 storage hides it): a bf16 forward is allowed for"
    if all(_representable(f, torch.bfloat16) for f in feats):
        return store, "bf16", "every stored value is a bf16 number: a bf16 forward"
    if store == "fp32" and all(_representable(f, torch.float16) for f in feats):
        return store, "fp16", "every stored value is an fp16 number: an fp16 forward"
    if store == "fp16":
        return store, "fp16", "fp16 storage hides an fp32 forward from an fp16 one: an fp16 forward is allowed for"
    return store, "fp32", "stored values are not half-precision numbers: an fp32 forward"


def dataset_tolerance(man: Manifest, ds: FeatureDataset, num_samples: int, also: str | None = None) -> dict:
    """The tolerance for this dataset; `also` adds another forward's dtype (doctor online's serving target)."""
    store, compute, how = forward_precision(man, ds, num_samples)
    if also in COMPUTE_ALLOWANCE and COMPUTE_ALLOWANCE[also] > COMPUTE_ALLOWANCE[compute]:
        compute, how = also, f"{how}; compared with a {also} forward"
    return {"tolerance": match_tolerance(store, compute), "store_dtype": store, "forward_dtype": compute, "how": how}


def all_points(num_layers: int) -> list[Point]:
    return [EMBED] + [layer_out(k) for k in range(num_layers)] + [FINAL_NORM]


@torch.no_grad()
def identify_slots(target, ds: FeatureDataset, num_samples: int = 4,
                   tol: float = MATCH_REL_ERR) -> tuple[list[dict], dict]:
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
        rows.append({"slot": j if j < P else "target_hidden", "point": pts[best].name if rel[j, best] < tol else None,
                     "best": pts[best].name, "rel_err": float(rel[j, best]), "cosine": float(cos[j, best]),
                     "runner_up": pts[second].name, "runner_up_rel_err": float(rel[j, second])})
    return rows[:P], rows[P]


def doctor_dataset(data_dir, target, num_samples: int = 4) -> Report:
    rep = Report("dataset")
    man = Manifest.load(data_dir)
    L = target.num_layers
    diff = man.target.fingerprint.mismatch(TargetFingerprint.of(target))
    rep.add("target", not diff, "dataset made from this target" if not diff else f"fingerprint differs in {', '.join(diff)}",
            "pass the target the dataset was made from (--target); if it is that target, the manifest was edited")
    bad = [(e["file"], why) for e in man.shards if (why := shard_problem(Path(data_dir), e))]
    rep.add("shards", not bad, f"{len(man.shards)} shards match their manifest checksums" if not bad else
            "; ".join(f"{f}: {why}" for f, why in bad),
            f"run `eaglewire data extract {data_dir} --resume` (bad or missing shards are re-extracted)")
    if bad:  # features from corrupt shards would be misread as a wiring problem
        return rep
    ds = FeatureDataset(data_dir, verify=False, check_order=False)
    tol = dataset_tolerance(man, ds, num_samples)
    slots, th = identify_slots(target, ds, num_samples, tol["tolerance"])
    labels = man.point_names
    found = []
    for s, label in zip(slots, labels):
        found.append(s["point"])
        if s["point"] is None:
            rep.add(f"slot {s['slot']}", False, f"matches no target tensor (closest {s['best']}, rel err {s['rel_err']:.1e}, "
                    f"tolerance {tol['tolerance']:.1e} for {tol['store_dtype']} storage of a {tol['forward_dtype']} forward)",
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
            f"holds {th['best']} (rel err {th['rel_err']:.1e}, tolerance {tol['tolerance']:.1e})",
            "target_hidden must be the final-norm output (what the lm_head sees)")
    ident = [p for p in found if p is not None]
    if len(ident) == len(found):
        rep.data["identified"] = id_lists([Point.parse(p) for p in ident], L)
    rep.data.update(slots=slots, target_hidden=th, tolerance=tol, manifest_points=man.to_json()["points"], num_samples=min(num_samples, len(ds)))
    return rep
