"""Training throughput: eaglewire's EAGLE-3 TTT step vs speculators' Eagle3DraftModel.

Usage:
    EAGLEWIRE_CACHE=/tmp/ewcache python benchmarks/bench_train.py \
        [--seq-lens 512 1024] [--batch 1] [--steps 5] [--acc-steps 30] [--json]

Both sides train one EAGLE-3 drafter for the default target's shapes
(SmolLM2-135M: H=576, 3 aux layers, vocab 49,152), draft vocab 8192, 7 TTT
steps, loss decay 0.8, SDPA attention, fp32, AdamW (same lr / betas / weight
decay / clip), ``--threads`` CPU threads, on the *same* batch and the *same*
initial weights:

* ours: exactly ``eaglewire.training.loop.train_step``'s body (``_micro_batch_loss`` ->
  ``ttt_forward``, backward, ``clip_grad_norm_``, ``AdamW.step``), minus
  dataset reading/collation;
* speculators 0.9.0 (its own venv, via ``_speculators_train_step.py``): the body
  of its ``Trainer.train_epoch`` around ``Eagle3DraftModel.forward`` built by
  ``from_training_args(..., draft_attn_impl="sdpa")``, kl_div loss ("eager":
  its fused losses need Triton), AdamW from its ``build_optimizers``.

Inputs are realistic rather than Gaussian: text tokens (this repository's own
README and sources, tokenised by the target) run once through the real target
to capture the EAGLE-3 features (HF hidden_states 2, L//2, L-3), the final-norm
hidden state (ours) and the pre-norm last hidden state (speculators applies the
final norm itself). They are saved to one safetensors file that the
speculators subprocess reads. The draft vocab is built to contain every target
argmax of the batch, so both implementations' acc_0 definitions coincide (ours:
full-vocab argmax, positions whose argmax is outside the draft vocab masked;
speculators: argmax of the draft-vocab-restricted target logits).

Timing: one warm-up step, then ``--steps`` steps each; the median step time is
reported (ours is timed in two halves, before and after speculators, so load
from other users of the machine hits both). tokens/s = B*T / median step time.
The ``ours (frozen lm_head)`` row is a compute-matched reference: speculators
0.9.0 freezes its draft lm_head (rows of the target head), ours trains it.

Equal-accuracy check (``--acc-steps``, at the first --seq-len): both start from
the same weights (draft lm_head = the target head's draft-vocab rows, as
speculators initialises it) and train the same number of steps on the same
fixed batch; acc_0 after the last update is compared.

If ours is below ``--goal`` x speculators at any length, ours is profiled
(torch.profiler + a phase breakdown) and the top operators are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]

from eaglewire.data.pipeline import auto_vocab_size  # noqa: E402
from eaglewire.drafter import DrafterConfig, Eagle3Drafter  # noqa: E402
from eaglewire.drafter.ttt import prepare_targets, ttt_forward  # noqa: E402
from eaglewire.targets.load import load_target  # noqa: E402
from eaglewire.training.loop import _micro_batch_loss  # noqa: E402
from eaglewire_testing.speculators_venv import ensure_speculators_venv  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# --------------------------------------------------------------------- inputs
def text_tokens(tok, n: int) -> list[int]:
    """``n`` tokens of real text: this repository's README and sources, repeated if short."""
    files = [REPO / "README.md", *sorted((REPO / "src" / "eaglewire").rglob("*.py"))]
    text = "\n\n".join(p.read_text(errors="replace") for p in files if p.is_file())
    ids = tok(text, add_special_tokens=False)["input_ids"]
    while len(ids) < n:
        ids = ids + ids
    return ids


@torch.no_grad()
def capture(target, ids: torch.Tensor, layer_ids: list[int]) -> dict:
    """Run the target on ``ids [B, T]``: features, final-norm and pre-norm last hidden states."""
    model = target.model
    pre = {}
    last = model.model.layers[-1]
    h = last.register_forward_hook(lambda m, i, o: pre.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    try:
        out = model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    hs = out.hidden_states
    return {
        "features": torch.stack([hs[i] for i in layer_ids], dim=2).float(),  # [B, T, 3, H]
        "target_hidden": out.last_hidden_state.float(),  # [B, T, H] after the final norm
        "pre_norm": pre["h"].float(),  # [B, T, H] before the final norm
    }


def draft_vocab(argmax: torch.Tensor, input_ids: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """``size`` ascending target ids: every target argmax and input token of the batch, then the lowest ids."""
    chosen = torch.zeros(vocab, dtype=torch.bool)
    chosen[argmax.flatten()] = True
    chosen[input_ids.flatten()] = True
    ids = chosen.nonzero().flatten()
    if ids.numel() > size:  # keep all argmaxes, drop input-only tokens
        only_in = ids[~torch.isin(ids, argmax.flatten().unique())]
        ids = torch.cat([argmax.flatten().unique(), only_in[: size - argmax.flatten().unique().numel()]])
    rest = (~chosen).nonzero().flatten()[: size - ids.numel()]
    return torch.sort(torch.cat([ids, rest])).values


def speculators_batch(cap: dict, ids: torch.Tensor) -> dict:
    """Pack B sequences into speculators' [1, N] layout after its shift_batch (x[1:], f[:-1], y[1:])."""
    b, t = ids.shape
    feats = cap["features"].flatten(2)
    return {
        "hidden_states": feats[:, :-1].reshape(1, b * (t - 1), -1).contiguous(),
        "input_ids": ids[:, 1:].reshape(1, -1).contiguous(),
        "verifier": cap["pre_norm"][:, 1:].reshape(1, b * (t - 1), -1).contiguous(),
        "loss_mask": torch.ones(1, b * (t - 1), dtype=torch.bool),
        "document_ids": torch.arange(b).repeat_interleave(t - 1)[None].contiguous(),
        "position_ids": torch.arange(1, t).repeat(b)[None].contiguous(),
    }


def to_speculators_names(sd: dict) -> dict:
    """Our single-layer state dict -> speculators Eagle3 trainable weights (``init.`` prefixed)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("midlayer."):
            out["init.layers.0." + k[len("midlayer."):]] = v
        elif k in ("fc.weight", "norm.weight", "lm_head.weight"):
            out["init." + k] = v
    return {k: v.detach().float().contiguous() for k, v in out.items()}


# ---------------------------------------------------------------------- ours
def build_ours(dcfg: DrafterConfig, init: dict, freeze_head: bool, args) -> tuple:
    model = Eagle3Drafter(dcfg)
    model.load_state_dict(init, strict=True)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(not freeze_head)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), weight_decay=args.weight_decay)
    return model, opt


def ours_step(model, opt, batch: dict, head_w: torch.Tensor, cfg, clip: float) -> tuple[float, list[float]]:
    """eaglewire.training.loop.train_step's body for one micro-batch (single process)."""
    n_global = (batch["loss_mask"] & batch["attention_mask"]).sum().float()
    opt.zero_grad(set_to_none=True)
    loss, c, n, total = _micro_batch_loss(model, batch, head_w, cfg, n_global, 1, "cpu")
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], clip)
    opt.step()
    return float(loss.detach()), [int(a) / max(int(b), 1) for a, b in zip(c, n)]


def time_ours(model, opt, batch, head_w, cfg, clip, warmup: int, steps: int) -> list[float]:
    ts = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        ours_step(model, opt, batch, head_w, cfg, clip)
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
    return ts


@torch.no_grad()
def ours_eval(model, batch, head_w, cfg) -> tuple[float, list[float]]:
    model.eval()
    n = (batch["loss_mask"] & batch["attention_mask"]).sum().float()
    loss, c, cnt, _ = _micro_batch_loss(model, batch, head_w, cfg, n, 1, "cpu")
    model.train()
    return float(loss), [int(a) / max(int(b), 1) for a, b in zip(c, cnt)]


def profile_ours(model, opt, batch, head_w, cfg, clip, top: int) -> dict:
    """Phase breakdown (median of 3) and torch.profiler's top operators for one step of ours."""
    feats = batch["features"].flatten(2)
    phases: dict[str, list[float]] = {"prepare_targets": [], "forward (incl. targets)": [], "backward": [],
                                      "clip+adamw": []}
    for _ in range(3):
        t0 = time.perf_counter()
        prepare_targets(model, batch["target_hidden"], head_w, batch["loss_mask"], batch["attention_mask"])
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = ttt_forward(model, feats, batch["input_ids"], batch["target_hidden"], head_w,
                          loss_mask=batch["loss_mask"], attention_mask=batch["attention_mask"],
                          steps=cfg.ttt_steps, decay=cfg.ttt_decay)
        t2 = time.perf_counter()
        out.loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], clip)
        opt.step()
        t4 = time.perf_counter()
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            phases[k].append(v)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        ours_step(model, opt, batch, head_w, cfg, clip)
    ka = prof.key_averages(group_by_input_shape=False)
    total = sum(e.self_cpu_time_total for e in ka)
    rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    ops = [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1),
            "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in rows]
    by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: e.self_cpu_time_total,
                      reverse=True)[:top]
    shapes = [{"op": e.key, "shapes": str(e.input_shapes)[:120], "self_ms": round(e.self_cpu_time_total / 1e3, 1),
               "calls": e.count} for e in by_shape]
    return {"phases_ms": {k: round(statistics.median(v) * 1e3, 1) for k, v in phases.items()},
            "profiled_total_ms": round(total / 1e3, 1), "top_ops": ops, "top_ops_by_shape": shapes}


# -------------------------------------------------------------- speculators
def run_speculators(py: Path, inputs: Path, verifier: Path, args, steps: int, acc_steps: int) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json", dir=inputs.parent)[1])
    cmd = [str(py), str(HERE / "_speculators_train_step.py"), str(inputs), str(verifier), str(out),
           "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(steps),
           "--acc-steps", str(acc_steps), "--ttt-steps", str(args.ttt_steps), "--decay", str(args.decay),
           "--lr", str(args.lr), "--beta1", str(args.beta1), "--beta2", str(args.beta2),
           "--weight-decay", str(args.weight_decay), "--clip", str(args.clip),
           "--layer-ids", *map(str, args.layer_ids)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": "",
           "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if r.returncode != 0:
        raise SystemExit("speculators run failed:\n" + (r.stderr or r.stdout)[-3000:])
    return json.loads(out.read_text())


def contention_probe(threads: int) -> dict:
    """us per small elementwise op at 1 vs ``threads`` threads: a large gap means another
    process holds a core and every multi-threaded op waits for a descheduled thread."""
    a, b = torch.randn(64, 576), torch.randn(64, 576)
    out = {}
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        t0 = time.perf_counter()
        for _ in range(300):
            torch.mul(a, b)
        out[f"mul_us_{n}t"] = round((time.perf_counter() - t0) / 300 * 1e6, 1)
    torch.set_num_threads(threads)
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per implementation and length")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--acc-steps", type=int, default=30, help="equal-accuracy check steps (0 = skip)")
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--draft-vocab", type=int, default=0, help="0 = eaglewire's auto_vocab_size (8192)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--goal", type=float, default=1.5, help="profile ours when ours/speculators < goal")
    ap.add_argument("--profile", choices=["auto", "always", "never"], default="auto")
    ap.add_argument("--no-frozen-head-row", action="store_true", help="skip the ours (frozen lm_head) timing row")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    py = ensure_speculators_venv()
    target = load_target(args.target)
    L, H, V = target.num_layers, target.hidden_size, target.vocab_size
    args.layer_ids = [2, L // 2, L - 3]  # EAGLE-3 default triple (HF hidden_states indices)
    D = args.draft_vocab or auto_vocab_size(V)
    head_w = target.model.get_output_embeddings().weight.detach().float()  # [V, H]
    embed_w = target.model.get_input_embeddings().weight.detach().float()
    dcfg = DrafterConfig.from_target_config(target.config, draft_vocab_size=D, num_aux=3)
    cfg = SimpleNamespace(ttt_steps=args.ttt_steps, ttt_decay=args.decay)
    tmp = Path(tempfile.mkdtemp(prefix="bench_train-"))
    res: dict = {"target": args.target, "target_path": str(target.path), "hidden": H, "layers": L, "vocab": V,
                 "draft_vocab": D, "batch": args.batch, "ttt_steps": args.ttt_steps, "decay": args.decay,
                 "threads": args.threads, "dtype": "float32", "attn": "sdpa", "timed_steps": args.steps,
                 "warmup_steps": args.warmup, "optimizer": {"name": "AdamW", "lr": args.lr,
                 "betas": [args.beta1, args.beta2], "weight_decay": args.weight_decay, "clip": args.clip},
                 "lengths": []}
    res["contention_before"] = contention_probe(args.threads)
    tok_stream = text_tokens(target.tokenizer, args.batch * max(args.seq_lens))

    for li, T in enumerate(args.seq_lens):
        B = args.batch
        ids = torch.tensor(tok_stream[: B * T]).view(B, T)
        t0 = time.perf_counter()
        cap = capture(target, ids, args.layer_ids)
        argmax = (cap["target_hidden"] @ head_w.T).argmax(-1)
        vocab_ids = draft_vocab(argmax, ids, V, D)
        log(f"[T={T}] captured target features in {time.perf_counter() - t0:.1f} s; "
            f"{argmax.unique().numel()} distinct target argmaxes, all in the {D}-token draft vocab")

        torch.manual_seed(0)
        init_model = Eagle3Drafter(dcfg)
        init_model.load_target_embedding(embed_w)
        init_model.set_draft_vocab(vocab_ids)
        with torch.no_grad():  # speculators' init: draft lm_head = target head rows of the draft vocab
            init_model.lm_head.weight.copy_(head_w[init_model.draft_target_ids()])
        init = {k: v.clone() for k, v in init_model.state_dict().items()}
        t2d = init_model.t2d.clone()
        d2t = init_model.d2t.clone()
        del init_model

        batch = {"features": cap["features"], "input_ids": ids, "target_hidden": cap["target_hidden"],
                 "loss_mask": torch.ones(B, T, dtype=torch.bool), "attention_mask": torch.ones(B, T, dtype=torch.bool)}
        from safetensors.torch import save_file

        inputs = tmp / f"inputs_T{T}.safetensors"
        save_file({**speculators_batch(cap, ids), "t2d": t2d, "d2t": d2t, **to_speculators_names(init)}, str(inputs))

        acc_steps = args.acc_steps if li == 0 else 0
        half = max(1, args.steps // 2)
        row: dict = {"seq_len": T, "tokens_per_step": B * T}

        # ours, first half
        model, opt = build_ours(dcfg, init, False, args)
        ts_ours = time_ours(model, opt, batch, head_w, cfg, args.clip, args.warmup, half)
        log(f"[T={T}] ours: {[round(x, 3) for x in ts_ours]} s")
        # speculators (timing + optional accuracy run)
        t0 = time.perf_counter()
        spec = run_speculators(py, inputs, target.path, args, args.steps, acc_steps)
        log(f"[T={T}] speculators: {[round(x, 3) for x in spec['step_s']]} s "
            f"(subprocess {time.perf_counter() - t0:.0f} s)")
        # ours, second half (same model keeps training; the step cost does not depend on the weights)
        ts_ours += time_ours(model, opt, batch, head_w, cfg, args.clip, 0, args.steps - half)
        log(f"[T={T}] ours (all): {[round(x, 3) for x in ts_ours]} s")
        med_ours = statistics.median(ts_ours)
        med_spec = spec["median_s"]
        row["ours"] = {"step_s": ts_ours, "median_s": med_ours, "tokens_per_s": B * T / med_ours}
        row["speculators"] = {"step_s": spec["step_s"], "median_s": med_spec, "tokens_per_s": B * T / med_spec,
                              "version": spec["speculators_version"]}
        row["ratio"] = med_spec / med_ours
        if not args.no_frozen_head_row:
            m2, o2 = build_ours(dcfg, init, True, args)
            ts = time_ours(m2, o2, batch, head_w, cfg, args.clip, args.warmup, args.steps)
            row["ours_frozen_head"] = {"step_s": ts, "median_s": statistics.median(ts),
                                       "tokens_per_s": B * T / statistics.median(ts)}
            row["ratio_frozen_head"] = med_spec / statistics.median(ts)
            del m2, o2

        if acc_steps:
            log(f"[T={T}] equal-accuracy check: {acc_steps} steps on the fixed batch ...")
            check: dict = {"seq_len": T, "steps": acc_steps, "speculators": spec["acc_check"]}
            for name, freeze, rand_head in (("ours", False, False), ("ours_random_head", False, True)):
                ini = dict(init)
                if rand_head:  # what eaglewire.training.loop.build_drafter does: nn.Linear default init
                    torch.manual_seed(0)
                    ini["lm_head.weight"] = Eagle3Drafter(dcfg).lm_head.weight.detach().clone()
                m3, o3 = build_ours(dcfg, ini, freeze, args)
                traj = []
                for _ in range(acc_steps):
                    loss, acc = ours_step(m3, o3, batch, head_w, cfg, args.clip)
                    traj.append({"loss": loss, "acc": acc})
                fl, fa = ours_eval(m3, batch, head_w, cfg)
                check[name] = {"trajectory": traj, "final_loss": fl, "final_acc": fa}
                del m3, o3
            res["acc_check"] = check
        res["lengths"].append(row)

        need_profile = args.profile == "always" or (args.profile == "auto" and row["ratio"] < args.goal)
        if need_profile:
            log(f"[T={T}] profiling ours ...")
            row["profile_ours"] = profile_ours(model, opt, batch, head_w, cfg, args.clip, top=15)
        del model, opt

    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    res["contention_after"] = contention_probe(args.threads)
    res["goal"] = args.goal
    res["goal_met"] = all(r["ratio"] >= args.goal for r in res["lengths"])
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print_table(res)


def print_table(res: dict) -> None:
    print(f"\nEAGLE-3 training step, target {res['target']} (H={res['hidden']}, V={res['vocab']}), draft vocab "
          f"{res['draft_vocab']}, TTT {res['ttt_steps']} steps, B={res['batch']}, fp32, sdpa, "
          f"{res['threads']} threads, median of {res['timed_steps']} steps after {res['warmup_steps']} warm-up")
    print(f"{'T':>6} {'impl':<26} {'median s':>9} {'tokens/s':>9} {'ours/spec':>9}")
    for r in res["lengths"]:
        spec = r["speculators"]
        print(f"{r['seq_len']:>6} {'speculators ' + spec['version']:<26} {spec['median_s']:>9.3f} "
              f"{spec['tokens_per_s']:>9.1f} {'':>9}")
        print(f"{'':>6} {'eaglewire':<26} {r['ours']['median_s']:>9.3f} {r['ours']['tokens_per_s']:>9.1f} "
              f"{r['ratio']:>8.2f}x")
        if "ours_frozen_head" in r:
            f = r["ours_frozen_head"]
            print(f"{'':>6} {'eaglewire (frozen lm_head)':<26} {f['median_s']:>9.3f} {f['tokens_per_s']:>9.1f} "
                  f"{r['ratio_frozen_head']:>8.2f}x")
    print(f"contention probe (us per small mul at 1 / {res['threads']} threads, load avg): "
          f"before {res['contention_before']}, after {res['contention_after']}")
    print(f"goal ours >= {res['goal']}x speculators: {'met' if res['goal_met'] else 'NOT met'}")
    chk = res.get("acc_check")
    if chk:
        print(f"\nequal-accuracy check: T={chk['seq_len']}, {chk['steps']} steps on one fixed batch, same init "
              f"(lm_head = target head rows), acc after the last update:")
        for name in ("speculators", "ours", "ours_random_head"):
            c = chk[name]
            accs = " ".join(f"{a:.3f}" for a in c["final_acc"])
            print(f"  {name:<18} acc_0 {c['final_acc'][0]:.3f}  acc_0..6 {accs}  (first-step acc_0 "
                  f"{c['trajectory'][0]['acc'][0]:.3f})")
    else:
        print("\nequal-accuracy check: skipped (--acc-steps 0)")
    for r in res["lengths"]:
        p = r.get("profile_ours")
        if not p:
            continue
        print(f"\nprofile of ours at T={r['seq_len']}: phases (ms) {p['phases_ms']}")
        for o in p["top_ops"]:
            print(f"  {o['op']:<40} {o['self_ms']:>8.1f} ms {o['share'] * 100:>5.1f}%  x{o['calls']}")
        print("  by input shape:")
        for o in p["top_ops_by_shape"][:8]:
            print(f"  {o['op']:<28} {o['self_ms']:>8.1f} ms x{o['calls']:<4} {o['shapes']}")


if __name__ == "__main__":
    main()
