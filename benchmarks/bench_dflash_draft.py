"""Draft cost per round: one DFlash block forward for K drafts against K EAGLE-3 draft steps, side by side.

Why: a DFlash round drafts its K tokens in one drafter forward (plus one lm_head call over K rows);
an EAGLE-3 chain takes K sequential steps. What that buys on this machine is a measured ratio, not a
claim. Both drafters are random (the cost does not depend on the weights) and wired to the same target
the way `eaglewire generate` runs them: EAGLE-3 through ``DraftRunner.chain`` (the draft weights
``--draft-weights``, int8 by default as in `generate`), one layer, a draft vocab of 8192 (``data build``'s
default), on the ``eagle3-deep`` points; DFlash
through ``BlockDrafter.draft`` (decoding/dflash.py), one layer, block_size K+1, mask token 16, z-lab ids
[1, 14, 28] on the default target (the same points). Both read the target's features of one prompt;
the rounds alternate (EAGLE-3 then DFlash, then the other order) so machine noise falls on both alike.

    python benchmarks/bench_dflash_draft.py --depth 3 --rounds 60 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from eaglewire.decoding.dflash import BlockDrafter
from eaglewire.decoding.draft import DraftRunner
from eaglewire.decoding.engine import SpecEngine
from eaglewire.decoding.target_runner import TargetRunner
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.targets.load import load_target
from eaglewire.targets.points import eagle3_deep

PROMPT = "Explain in a few sentences why the sky is blue, and what changes at sunset."


def drafters(target, depth: int, mask: int, weights: str, draft_vocab: int):
    """(DraftRunner over a random EAGLE-3 drafter, BlockDrafter over a random DFlash drafter), both prefilled."""
    points = eagle3_deep(target.num_layers)
    runner = TargetRunner(target, points)
    ids = SpecEngine(target).encode(PROMPT)
    hidden, feats = runner.forward(torch.tensor([ids]))
    root = int(runner.logits(hidden[0, -1:])[0].argmax())
    torch.manual_seed(0)
    dv = min(draft_vocab, target.vocab_size)
    eagle = Eagle3Drafter(DrafterConfig.from_target_config(target.config, draft_vocab_size=dv, num_aux=len(points)))
    eagle.load_target_embedding(target.model.get_input_embeddings().weight)
    eagle.set_draft_vocab(torch.arange(dv))
    eagle.eval()
    e_run = DraftRunner(eagle, weights=weights)
    e_run.extend(torch.tensor([ids[1:] + [root]]), feats)
    ids_z = [p.layer for p in points]  # z-lab id k = layers.k.out
    d_cfg = DFlashConfig.from_target_config(target.config, mask_token_id=mask, block_size=depth + 1,
                                            target_layer_ids=ids_z)
    side = BlockDrafter(DFlashDrafter(d_cfg).eval(), target.model.get_input_embeddings().weight, runner.logits)
    side.extend(feats)
    return e_run, side, root, len(ids), ids_z


def measure(e_run, side, root: int, depth: int, rounds: int) -> dict:
    """Median seconds per drafting round of each, over ``rounds`` alternating rounds (after 5 warm-up rounds)."""
    t = {"eagle3": [], "dflash": []}
    run = {"eagle3": lambda: e_run.chain(root, depth), "dflash": lambda: side.draft(root, depth)}
    with torch.inference_mode():
        for _ in range(5):
            run["eagle3"]()
            run["dflash"]()
        for r in range(rounds):
            for name in (("eagle3", "dflash") if r % 2 == 0 else ("dflash", "eagle3")):
                t0 = time.perf_counter()
                run[name]()
                t[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in t.items()}
    return {"depth": depth, "rounds": rounds, "eagle3_ms_per_round": 1e3 * med["eagle3"],
            "dflash_ms_per_round": 1e3 * med["dflash"], "eagle3_over_dflash": med["eagle3"] / med["dflash"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--depth", type=int, default=3, help="drafts per round (K)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--mask-token", type=int, default=16)
    ap.add_argument("--draft-weights", default="int8", choices=("fp32", "bf16", "int8"))
    ap.add_argument("--draft-vocab", type=int, default=8192, help="the EAGLE-3 drafter's draft vocab")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    target = load_target(a.target)
    e_run, side, root, n_prompt, ids_z = drafters(target, a.depth, a.mask_token, a.draft_weights, a.draft_vocab)
    res = {"target": a.target, "prompt_tokens": n_prompt, "points_zlab_ids": ids_z,
           "eagle3_draft_weights": e_run.weights, "threads": torch.get_num_threads(),
           **measure(e_run, side, root, a.depth, a.rounds)}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{a.target}, K={a.depth}, {n_prompt}-token context, {res['threads']} thread(s): EAGLE-3 "
              f"{res['eagle3_ms_per_round']:.2f} ms/round ({e_run.weights}), DFlash {res['dflash_ms_per_round']:.2f} "
              f"ms/round (fp32): EAGLE-3 / DFlash = {res['eagle3_over_dflash']:.2f}x")


if __name__ == "__main__":
    main()
