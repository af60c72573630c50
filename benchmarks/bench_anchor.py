"""Drafter quality side by side with speculators' own trainer, on the same data (issue 35).

The question a user asks: given my data, does eaglewire train a better drafter than the tool I would
otherwise use? Both trainers get the same answers, the same features (eaglewire's extracted dataset,
converted), the same draft vocabulary, the same train/validation split and the same number of passes
over the training split; both drafters are scored the same way, by eaglewire's held-out count (mean
acceptance length at chain depth 3, ungated, as vLLM counts it) on the shipped held-out prompts.

Rows (`--rows`, comma-separated):
  theirs         speculators 0.9.0 with its recipe (_speculators_train.py: Muon + AdamW at lr 1e-3, linear
                 schedule with 1 % warmup, KL over the draft vocabulary, 3 TTT steps at decay 1.0, clip 1.0,
                 norm_before_fc + norm_output + norm_before_residual, lm_head = the target's rows, frozen,
                 samples packed into --seq-len tokens a step, the epoch with the best validation loss kept),
                 imported with `eaglewire import`
  ours           `eaglewire train` with the quick preset's recipe
  ours-recipe    `eaglewire train` with speculators' hyperparameters where eaglewire has them (AdamW in place
                 of Muon): steps of about --seq-len tokens (gradient accumulation), lr 1e-3, warmup 1 %, weight
                 decay 0.01, betas (0.9, 0.999), clip 1.0, 3 TTT steps at decay 1.0, the same three norms, the
                 head from the target and frozen, random init
  ours-norms     the quick preset's recipe plus speculators' norms (norm_before_fc + norm_output)
  ours-3.1       the quick preset's recipe as EAGLE-3.1: per-slot fc_norm + post-norm recursion (norm_output)
  ours-select-acc / ours-select-loss
                 the quick preset's run validated 16 times, the weights with the best validation mean acceptance
                 length (SpecForge's choice) or loss (speculators') kept: the same trajectory as `ours`

What goes to speculators: hs_<i>.safetensors holds the three captured layers and, as its fourth slot, the
last layer's output before the final norm. eaglewire stores the final-normed state y = x / rms(x) * w;
speculators applies the final norm itself, so it gets y / w, whose RMS is 1 and whose norm is y again
(to a relative 1e-5, the norm's epsilon): its training targets are the target's logits, as ours are.

    python benchmarks/bench_anchor.py --data runs/q/data --heldout runs/q/heldout --out runs/anchor \
        [--epochs 2] [--rows theirs,ours,ours-recipe,ours-norms] [--json OUT]

Prints a table (held-out mean acceptance length with its 95% interval, per position, validation loss where
recorded, optimizer steps, wall minutes) and writes it as JSON. Runs are long (each is one training run):
nothing else heavy should run beside them when the minutes are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_heldout import categories, load_head_and_tokenizer, score  # noqa: E402

from eaglewire.data.dataset import FeatureDataset  # noqa: E402
from eaglewire.data.vocab import load_vocab  # noqa: E402
from eaglewire.saved.checkpoint import read_provenance  # noqa: E402
from eaglewire.targets.load import load_target, resolve_target_dir  # noqa: E402
from eaglewire.targets.points import Point  # noqa: E402
from eaglewire.training.schedule import split_indices  # noqa: E402
from eaglewire_testing.speculators_venv import ensure_speculators_venv  # noqa: E402

HERE = Path(__file__).resolve().parent
EAGLEWIRE = [str(Path(sys.executable).with_name("eaglewire"))]
QUICK = ["--batch-size", "2", "--lr", "0.003", "--ttt-steps", "3", "--lk-weight", "1", "--max-len", "512",
         "--init", "target", "--freeze-head"]


def convert(data: Path, out: Path, val_fraction: float, seed: int) -> tuple[Path, float, list[int]]:
    """eaglewire's dataset as speculators' offline data: training rows first (our split), then validation."""
    done = out / "rows.json"
    ds = FeatureDataset(data, verify=False)
    man = ds.manifest
    train_idx, val_idx = split_indices(len(ds), val_fraction, seed)
    ratio = (len(train_idx) + 0.5) / len(ds)  # speculators trains on the first int(n * ratio) rows
    ids = [Point.parse(n).layer + 1 for n in man.point_names]  # layers.k.out = HF hidden_states[k + 1]
    if done.is_file():
        return out, ratio, ids
    target = load_target(man.target.source)
    w = target.model.model.norm.weight.detach().float()  # [H]
    if bool((w.abs() < 1e-12).any()):
        raise SystemExit("the target's final norm has a zero weight: its pre-norm state cannot be recovered")
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows = []
    for j, i in enumerate(train_idx + val_idx):
        s = ds[i]
        feats = s["features"].float()  # [T, 3, H]
        last = (s["target_hidden"].float() / w)[:, None]  # [T, 1, H], RMS 1: the final norm maps it back to y
        save_file({"hidden_states": torch.cat([feats, last], 1).contiguous(),
                   "token_ids": s["input_ids"].long().contiguous()}, str(out / "hidden_states" / f"hs_{j}.safetensors"))
        rows.append({"input_ids": s["input_ids"].tolist(), "loss_mask": s["loss_mask"].long().tolist()})
    vocab = load_vocab(data)
    save_file({"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}, str(out / "vocab.safetensors"))
    done.write_text(json.dumps(rows))
    return out, ratio, ids


def _run(cmd: list, log: Path, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode:
        raise SystemExit(f"`{' '.join(map(str, cmd[:6]))} ...` failed (exit {r.returncode}): see {log}")
    return time.perf_counter() - t0


def theirs(a, out: Path) -> dict:
    spec_data, ratio, ids = convert(a.data, out / "spec-data", a.val_fraction, a.seed)
    source = FeatureDataset(a.data, verify=False).manifest.target.source
    verifier = resolve_target_dir(source)
    py = ensure_speculators_venv()
    run = out / "theirs"
    if not (run / "result.json").is_file():
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
        _run([py, HERE / "_speculators_train.py", spec_data, verifier, run, "--epochs", a.epochs, "--lr", a.spec_lr,
              "--seq-len", a.seq_len, "--threads", a.threads, "--train-ratio", ratio, "--layer-ids", *ids],
             out / "theirs.log", env)
    res = json.loads((run / "result.json").read_text())
    ckpt = out / "theirs-ckpt"
    if not (ckpt / "eaglewire.json").is_file():
        _run([*EAGLEWIRE, "import", run / "best", "--out", ckpt, "--target", source, "--force"],
             out / "theirs-import.log")
    val = res["epochs"][res["best_epoch"]]["val_loss"]
    return {"ckpt": ckpt, "steps": res["total_steps"], "minutes": res["seconds"] / 60,
            "note": f"best epoch {res['best_epoch']} of {len(res['epochs'])}, val KL {val:.3f}"}


def ours(a, out: Path, name: str, extra: list[str]) -> dict:
    run = out / name
    seconds = 0.0
    if not (run / "drafter" / "eaglewire.json").is_file():
        seconds = _run([*EAGLEWIRE, "train", "--data", a.data, "--out", run, "--epochs", a.epochs, "--seed", a.seed,
                        "--val-fraction", a.val_fraction, "--save-every", 100000, *extra], out / f"{name}.log")
    cfg = json.loads((run / "train.config.json").read_text())
    prov = read_provenance(run / "drafter")
    sel = (prov.training or {}).get("selected") or {}
    note = ""
    if sel.get("by", "last") != "last":
        v, last = prov.validation or {}, (prov.training or {}).get("last_validation") or {}
        note = f"step {sel['step']} kept by {sel['by']}; val loss {v.get('loss', float('nan')):.3f} (last {last.get('loss', float('nan')):.3f})"
        if "mean_acceptance_length" in v:
            note += f", val MAL {v['mean_acceptance_length']:.3f} (last {last.get('mean_acceptance_length', float('nan')):.3f})"
    return {"ckpt": run / "drafter", "steps": cfg.get("total_steps"), "minutes": seconds / 60, "note": note}


def select_flags(a, by: str) -> list[str]:
    """The quick recipe validated 16 times over the run and the best weights kept: the trajectory is ours' own
    (validation draws no random numbers), so the row differs from `ours` by the selection alone."""
    n_train = len(split_indices(len(FeatureDataset(a.data, verify=False)), a.val_fraction, a.seed)[0])
    return [*QUICK, "--select", by, "--eval-every", max(1, a.epochs * (n_train // 2) // 16)]


def recipe_flags(a) -> list[str]:
    """speculators' step is one packed row of --seq-len tokens: here 2 samples x --grad-accum (answers of the
    quick preset are ~180 tokens with their prompts), so ours takes about as many, as large, steps."""
    accum = max(1, round(a.seq_len / 360))
    n_train = len(split_indices(len(FeatureDataset(a.data, verify=False)), a.val_fraction, a.seed)[0])
    steps = a.epochs * (n_train // (2 * accum))
    return ["--batch-size", "2", "--grad-accum", accum, "--lr", "0.001", "--min-lr-ratio", "0", "--warmup-steps", max(steps // 100, 1),
            "--weight-decay", "0.01", "--beta2", "0.999", "--grad-clip", "1.0", "--ttt-steps", "3", "--ttt-decay", "1",
            "--max-len", "512", "--init", "head", "--freeze-head", "--norm-before-fc", "--norm-output",
            "--norm-before-residual"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="the training dataset (eaglewire data build)")
    ap.add_argument("--heldout", type=Path, required=True, help="a dataset of the shipped held-out prompts' answers")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="theirs,ours,ours-recipe,ours-norms")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=2048, help="speculators: tokens packed per step (8192 on GPUs)")
    ap.add_argument("--spec-lr", type=float, default=1e-3)
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    head_w, tok = load_head_and_tokenizer("default")
    cats = categories(a.heldout, FeatureDataset(a.heldout, verify=False), tok)
    makers = {"theirs": lambda: theirs(a, a.out), "ours": lambda: ours(a, a.out, "ours", QUICK),
              "ours-recipe": lambda: ours(a, a.out, "ours-recipe", recipe_flags(a)),
              "ours-norms": lambda: ours(a, a.out, "ours-norms", [*QUICK, "--norm-before-fc", "--norm-output"]),
              "ours-3.1": lambda: ours(a, a.out, "ours-3.1", [*QUICK, "--fc-norm", "--norm-output"]),
              "ours-select-acc": lambda: ours(a, a.out, "ours-select-acc", select_flags(a, "acceptance")),
              "ours-select-loss": lambda: ours(a, a.out, "ours-select-loss", select_flags(a, "loss"))}
    rows = []
    for name in a.rows.split(","):
        made = makers[name]()
        s = score(made["ckpt"], a.heldout, head_w, cats, depth=3)
        rows.append({"row": name, **{k: (str(v) if isinstance(v, Path) else v) for k, v in made.items()}, **s})
        r = rows[-1]
        print(f"{name:<16} MAL@3 {r['mean_acceptance_length']:.3f} (95% {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}) "
              f"per position {' '.join(f'{x:.2f}' for x in r['acceptance_rate_per_position'])}  steps {r['steps']}  "
              f"{r['minutes']:.1f} min  {r['note']}", flush=True)
    (a.out / "anchor.json").write_text(json.dumps(rows, indent=2))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
