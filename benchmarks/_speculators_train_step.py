"""Time real speculators Eagle3 training steps (run by bench_train.py in the speculators venv).

Executed by the speculators venv's python, never imported by eaglewire: it
depends only on torch, safetensors and speculators 0.9.0.

    python _speculators_train_step.py INPUTS VERIFIER_DIR OUT_JSON \
        --threads 2 --warmup 1 --steps 5 --acc-steps 30 --lr 3e-4 --clip 0.5 ...

INPUTS (safetensors, written by bench_train.py), one packed batch already in
speculators' post-``shift_batch`` layout (input_ids x[1:], hidden_states f[:-1],
verifier_last_hidden_states y[1:] = the *pre*-final-norm last hidden state):
``hidden_states [1, N, 3H]``, ``input_ids [1, N]``, ``document_ids [1, N]``,
``position_ids [1, N]``, ``loss_mask bool [1, N]``, ``verifier [1, N, H]``,
``t2d bool [V]``, ``d2t int64 [D]`` and ``init.<name>`` = initial draft weights
in speculators' naming (fc, layers.0.*, norm, lm_head).

One training step is exactly what speculators' Trainer.train_epoch does
(minus the device copy and the fp32 autocast, a no-op here):
``model(**batch, **train_kwargs)`` -> ``zero_grad`` -> ``loss.backward()`` ->
``clip_grad_norm_`` -> ``optimizer.step()``, with the model built by
``Eagle3DraftModel.from_training_args(..., draft_attn_impl="sdpa")``, the loss
config by ``Eagle3DraftModel.get_trainer_kwargs`` (kl_div, "eager": the fused
losses need Triton) and the optimizer by ``speculators.train.optimizers.build_optimizers``
(AdamW; betas then set to the value bench_train.py uses for ours).
"""

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import torch
from safetensors.torch import load_file


def build(args, x):
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.optimizers import build_optimizers

    # What speculators' train CLI builds by default for eagle3 (--num-layers 1, draft arch llama,
    # --sliding-window 2048), except that layer 0 uses full attention (--full-attention-indices 0)
    # like ours; for T <= 2048 the two masks are identical anyway.
    vcfg = create_transformer_layer_config(
        verifier_name_or_path=args.verifier, num_layers=1, draft_arch="llama", hidden_act="silu",
        sliding_window=2048, full_attention_indices=[0])
    model = Eagle3DraftModel.from_training_args(
        vcfg,
        t2d=x["t2d"],
        d2t=x["d2t"],
        num_layers=1,
        norm_before_residual=False,
        draft_vocab_size=int(x["d2t"].numel()),
        ttt_steps=args.ttt_steps,
        verifier_name_or_path=args.verifier,
        target_layer_ids=args.layer_ids,
        draft_attn_impl="sdpa",
    ).float()
    init = {k[len("init."):]: v for k, v in x.items() if k.startswith("init.")}
    missing = [k for k in init if k not in model.state_dict()]
    if missing:
        raise SystemExit(f"init weights with no slot in the speculators model: {missing}")
    model.load_state_dict(init, strict=False)
    nan = [n for n, p in model.state_dict().items() if p.is_floating_point() and torch.isnan(p).any()]
    if nan:
        raise SystemExit(f"weights left NaN: {nan}")
    model.train()
    opts = build_optimizers(model, SimpleNamespace(optimizer="adamw", lr=args.lr, weight_decay=args.weight_decay))
    for o in opts:
        for g in o.param_groups:
            g["betas"] = (args.beta1, args.beta2)
    train_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=args.ttt_steps,
        ttt_step_loss_decay=args.decay)
    return model, opts, train_kwargs


def build_cfg_probe(args):
    from speculators.train.cli import create_transformer_layer_config

    return create_transformer_layer_config(
        verifier_name_or_path=args.verifier, num_layers=1, draft_arch="llama", hidden_act="silu",
        sliding_window=2048, full_attention_indices=[0])


def train_step(model, opts, batch, train_kwargs, clip):
    """speculators Trainer.train_epoch's step body (single process)."""
    _draft_tokens, loss, metrics = model(**batch, **train_kwargs)
    for o in opts:
        o.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for o in opts:
        o.step()
    return loss, metrics


def acc(metrics, k):
    return float(metrics[f"full_acc_{k}_sum"]) / max(float(metrics[f"full_acc_{k}_total"]), 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs")
    ap.add_argument("verifier")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--acc-steps", type=int, default=0)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--layer-ids", type=int, nargs=3, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import importlib.metadata

    x = load_file(args.inputs)
    batch = {
        "hidden_states": x["hidden_states"],
        "input_ids": x["input_ids"],
        "document_ids": x["document_ids"],
        "position_ids": x["position_ids"],
        "loss_mask": x["loss_mask"].bool(),
        "verifier_last_hidden_states": x["verifier"],
    }
    n_tok = int(x["input_ids"].shape[1])
    res = {"draft_layer_config": {k: getattr(build_cfg_probe(args), k) for k in (
               "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "layer_types")},
           "speculators_version": importlib.metadata.version("speculators"), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "packed_tokens": n_tok}

    if args.steps:
        model, opts, kw = build(args, x)
        times, losses = [], []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss, metrics = train_step(model, opts, batch, kw, args.clip)
            dt = time.perf_counter() - t0
            losses.append(float(loss.detach()))
            if i >= args.warmup:
                times.append(dt)
        res.update(step_s=times, median_s=statistics.median(times), losses=losses)
        del model, opts

    if args.acc_steps:
        model, opts, kw = build(args, x)
        traj = []
        for _ in range(args.acc_steps):
            loss, metrics = train_step(model, opts, batch, kw, args.clip)
            traj.append({"loss": float(loss.detach()), "acc": [acc(metrics, k) for k in range(args.ttt_steps)]})
        model.eval()
        with torch.no_grad():
            _, loss, metrics = model(**batch, **kw)
        res["acc_check"] = {"trajectory": traj, "final_loss": float(loss),
                            "final_acc": [acc(metrics, k) for k in range(args.ttt_steps)]}
    with open(args.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
