"""Tree shapes side by side: plain decoding and several (top_k, depth, tokens, min_prob) trees, one drafter.

Usage: python benchmarks/bench_shapes.py --drafter RUN [--prompts 9] [--tokens 64]
       [--shape 3,2,7 --shape 3,2,7,0.05 ...] [--lookup 6] [--repeats 2] [--skip 18] [--json]

Methods run interleaved per prompt with a rotating order (greedy, the shipped
held-out prompts taken round-robin over categories); speed is reported as a
ratio to plain decoding measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from eaglewire.data.heldout import heldout_prompts_path  # noqa: E402
from eaglewire.decoding.compat import load_drafter_for  # noqa: E402
from eaglewire.decoding.engine import SpecConfig, SpecEngine  # noqa: E402
from eaglewire.decoding.run import round_robin as _round_robin  # noqa: E402
from eaglewire.targets.load import load_target  # noqa: E402

DEFAULT_SHAPES = ("3,4,10", "3,2,7", "2,3,6", "3,3,8")


def parse_shapes(texts: list[str]) -> dict:
    """{"plain": None, "tree k,d,n[,p]": (top_k, depth, total_tokens, min_prob)}."""
    shapes = {"plain": None}
    for t in texts:
        parts = t.split(",")
        if len(parts) not in (3, 4):
            raise SystemExit(f"--shape {t!r}: expected top_k,depth,total_tokens[,min_prob]")
        k, d, n = (int(x) for x in parts[:3])
        shapes[f"tree {t}"] = (k, d, n, float(parts[3]) if len(parts) == 4 else 0.0)
    return shapes


def run(drafter: str, n_prompts: int, tokens: int, target: str, shapes: dict | None = None,
        lookup: int = 0, repeats: int = 1, skip: int = 0) -> dict:
    shapes = shapes or parse_shapes(list(DEFAULT_SHAPES))
    t = load_target(target)
    rows = [json.loads(line) for line in open(heldout_prompts_path())]
    cats = [r["category"] for r in rows]
    skipped = set(_round_robin(skip, cats)) if skip else set()
    rows = [rows[i] for i in _round_robin(skip + n_prompts, cats) if i not in skipped]
    d, pts, _ = load_drafter_for(t, Path(drafter), force=False)
    plain, eng = SpecEngine(t), SpecEngine(t, d, pts)
    tot = {k: {"seconds": 0.0, "tokens": 0, "accepted_plus_bonus": 0, "rounds": 0, "drafted": 0} for k in shapes}
    for j, r in enumerate(rows * repeats):
        names = list(shapes)[j % len(shapes):] + list(shapes)[: j % len(shapes)]
        for k in names:
            s = shapes[k]
            e = plain if s is None else eng
            cfg = (SpecConfig(mode="plain", max_new_tokens=tokens) if s is None else
                   SpecConfig(mode="tree", top_k=s[0], tree_depth=s[1], total_tokens=s[2], min_prob=s[3],
                              lookup=lookup, max_new_tokens=tokens))
            ids = e.encode(r["prompt"])
            t0 = time.perf_counter()
            out = e.generate(ids, cfg)
            tot[k]["seconds"] += time.perf_counter() - t0
            tot[k]["tokens"] += out.metrics.generated
            tot[k]["accepted_plus_bonus"] += sum(x.accepted + x.bonus for x in out.metrics.steps)
            tot[k]["rounds"] += len(out.metrics.steps)
            tot[k]["drafted"] += sum(x.drafted for x in out.metrics.steps)
    base = tot["plain"]["tokens"] / tot["plain"]["seconds"]
    for v in tot.values():
        v["tok_s"] = v["tokens"] / v["seconds"]
        v["vs_plain"] = v["tok_s"] / base
        v["tau"] = v["accepted_plus_bonus"] / v["rounds"] if v["rounds"] else None
        v["drafted_per_round"] = v["drafted"] / v["rounds"] if v["rounds"] else None
    return {"drafter": drafter, "prompts": len(rows), "skipped": skip, "tokens": tokens, "repeats": repeats, "lookup": lookup,
            "methods": tot}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default="default")
    ap.add_argument("--prompts", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--shape", action="append", default=[], help="top_k,depth,total_tokens[,min_prob] (repeatable)")
    ap.add_argument("--lookup", type=int, default=0, help="add the context-lookup branch (greedy) to every tree")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the prompts the demo benches (round-robin first N: 18 = standard's) to tune on others")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.drafter, a.prompts, a.tokens, a.target, parse_shapes(a.shape or list(DEFAULT_SHAPES)),
              a.lookup, a.repeats, a.skip)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for k, v in res["methods"].items():
        tau = f"tau {v['tau']:.2f}" if v["tau"] else ""
        drafted = f"drafted/round {v['drafted_per_round']:.2f}" if v["drafted_per_round"] is not None else ""
        print(f"{k:20s} {v['tok_s']:5.1f} tok/s  {v['vs_plain']:.2f}x plain  {tau}  {drafted}")


if __name__ == "__main__":
    main()
