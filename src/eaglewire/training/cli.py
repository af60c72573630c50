"""`eaglewire train`: its options and its printed result; the run itself is :mod:`eaglewire.training.loop`.

Kept free of torch (the loop is imported when the command runs), so building
the CLI for `eaglewire --help` does not load it.
"""

from __future__ import annotations

from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit
from eaglewire.infra.ranks import is_main
from eaglewire.training.config import TrainConfig


def _print_result(res: dict) -> None:
    v = res["validation"]
    accs = " ".join(f"{a:.3f}" for a in v.get("acc", []))
    print(f"drafter: {res['drafter']}  steps {res['steps']}  val loss {v.get('loss', float('nan')):.4f}  acc_0..k {accs}")
    if res.get("drafter_kind") == "dflash" and "mean_acceptance_length" in v:
        d = res.get("dflash") or {}
        print(f"dflash: block {d.get('block_size')}  mask token {d.get('mask_token_id')}  target_layer_ids "
              f"{d.get('target_layer_ids')}  val acceptance length {v['mean_acceptance_length']:.3f} (teacher-forced)")
    if res.get("drafter_kind") == "p-eagle":
        d = res.get("peagle") or {}
        print(f"p-eagle: depths {d.get('depths')}  mask token {d.get('mask_token_id')}  (serve with "
              f"num_speculative_tokens {d.get('depths')} and parallel_drafting)")
    sel = res.get("selected") or {}
    if sel.get("by", "last") != "last":
        tau = f"  val acceptance {v['mean_acceptance_length']:.3f}" if "mean_acceptance_length" in v else ""
        print(f"selected by {sel['by']}: the weights of step {sel['step']} of {res['steps']}{tau}")


def run(cfg: TrainConfig) -> None:
    from eaglewire.training.loop import run_train

    res = run_train(cfg)
    if is_main():  # under torchrun rank 0 reports for the job
        emit(res, cfg.json, _print_result)


def register(app) -> None:
    build_command(app, "train", TrainConfig, run, "Train an EAGLE-3 drafter with training-time test (also under torchrun), or a DFlash block "
                  "drafter (--drafter dflash), or a P-EAGLE parallel drafter (--drafter p-eagle).")
