"""Tree shapes side by side: plain decoding and several (top_k, depth, tokens) trees, one drafter.

Usage: python benchmarks/bench_shapes.py --drafter RUN [--prompts 9] [--tokens 64] [--json]

Methods run interleaved per prompt with a rotating order (greedy, the shipped
held-out prompts taken round-robin over categories); speed is reported as a
ratio to plain decoding measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglewire.decoding.cli import _round_robin, heldout_prompts_path  # noqa: E402
from eaglewire.decoding.compat import load_drafter_for  # noqa: E402
from eaglewire.decoding.engine import SpecConfig, SpecEngine  # noqa: E402
from eaglewire.targets import load_target  # noqa: E402

SHAPES = {"plain": None, "tree 3,4,10": (3, 4, 10), "tree 3,2,7": (3, 2, 7), "tree 2,3,6": (2, 3, 6),
          "tree 3,3,8": (3, 3, 8)}


def run(drafter: str, n_prompts: int, tokens: int, target: str) -> dict:
    t = load_target(target)
    rows = [json.loads(line) for line in open(heldout_prompts_path())]
    rows = [rows[i] for i in _round_robin(n_prompts, [r["category"] for r in rows])]
    d, pts, _ = load_drafter_for(t, Path(drafter), force=False)
    plain, eng = SpecEngine(t), SpecEngine(t, d, pts)
    tot = {k: {"seconds": 0.0, "tokens": 0, "accepted_plus_bonus": 0, "rounds": 0} for k in SHAPES}
    for j, r in enumerate(rows):
        names = list(SHAPES)[j % len(SHAPES):] + list(SHAPES)[: j % len(SHAPES)]
        for k in names:
            s = SHAPES[k]
            e = plain if s is None else eng
            cfg = (SpecConfig(mode="plain", max_new_tokens=tokens) if s is None else
                   SpecConfig(mode="tree", top_k=s[0], tree_depth=s[1], total_tokens=s[2], max_new_tokens=tokens))
            ids = e.encode(r["prompt"])
            t0 = time.perf_counter()
            out = e.generate(ids, cfg)
            tot[k]["seconds"] += time.perf_counter() - t0
            tot[k]["tokens"] += out.metrics.generated
            tot[k]["accepted_plus_bonus"] += sum(x.accepted + x.bonus for x in out.metrics.steps)
            tot[k]["rounds"] += len(out.metrics.steps)
    base = tot["plain"]["tokens"] / tot["plain"]["seconds"]
    for v in tot.values():
        v["tok_s"] = v["tokens"] / v["seconds"]
        v["vs_plain"] = v["tok_s"] / base
        v["tau"] = v["accepted_plus_bonus"] / v["rounds"] if v["rounds"] else None
    return {"drafter": drafter, "prompts": len(rows), "tokens": tokens, "methods": tot}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", default="default")
    ap.add_argument("--prompts", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.drafter, a.prompts, a.tokens, a.target)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for k, v in res["methods"].items():
        tau = f"tau {v['tau']:.2f}" if v["tau"] else ""
        print(f"{k:12s} {v['tok_s']:5.1f} tok/s  {v['vs_plain']:.2f}x plain  {tau}")


if __name__ == "__main__":
    main()
