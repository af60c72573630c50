"""Train an EAGLE-3 drafter with training-time test, single process or under torchrun.

Exactness choices:
- the loss of a step is normalised by the number of loss-masked tokens of the
  whole *global* batch (all micro-batches, all ranks), computed up front from
  the data. Each micro-batch contributes sum-of-CE / N_global, so gradient
  accumulation and DDP (DistributedDataParallel averages gradients over ranks,
  hence x world size) give the same update as one process with the whole batch;
- the sample order is a pure function of (seed, step) (a seeded permutation
  per epoch) and the drafter has no dropout, so no RNG state is needed:
  model, optimizer and step are the resumable state, and a killed and resumed
  run reads the same samples in the same order and follows the same losses
  (both tested);
- `--online` swaps the feature shards for the target's forward on the same
  responses (`online.py`), sample for sample, so the losses are the same.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.data.settings import ExtractSettings
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.drafter.checkpoint import save_checkpoint
from eaglewire.drafter.ttt import target_full_argmax, ttt_forward
from eaglewire.drafter.warmstart import INITS, deepest_layer_slot, init_from_target_layer, init_head
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import check_ranges, config_to_dict, opt, save_config
from eaglewire.training.runstate import MetricsLog, load_run_state, save_state
from eaglewire.training.torchrun import CallThrough, Dist, unwrap

_STEP_DELAY = float(os.environ.get("EAGLEWIRE_STEP_DELAY", "0"))  # lets crash tests kill a real run


@dataclass
class TrainConfig:
    data: Path = opt(help="dataset directory (eaglewire data build; with --online, data generate)")
    out: Path = opt(help="run directory: drafter/ (the checkpoint), state/, metrics.csv, tb/")
    target: str = opt("", "target; default: the one recorded in the dataset manifest (must match its fingerprint), "
                      "with --online the one generate.config.json records")
    online: bool = opt(False, "run the target inside the loop on --data's responses.jsonl: no feature shards read or stored")
    points: list[str] = opt(help="--online: capture points (repeat or comma-separate); default: the EAGLE-3 triple",
                            factory=list)
    store_dtype: str = opt(ExtractSettings.dtype, "--online: round features to this dtype, as `data extract "
                           "--store-dtype` stores them (same losses as offline)", choices=("fp32", "bf16", "fp16"))
    dtype: str = opt("auto", "--online: target compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
                     choices=("auto", "fp32", "bf16", "fp16"))
    vocab_size: int = opt(0, "--online without vocab.safetensors in --data: draft vocab size, counted over the "
                          "responses as `data vocab` does (0 = auto)", ge=0)
    max_steps: int = opt(0, "optimizer steps; 0 = --epochs full passes", ge=0)
    epochs: int = opt(1, "passes over the training split when --max-steps is 0", ge=1)
    batch_size: int = opt(4, "samples per micro-batch per process", ge=1)
    grad_accum: int = opt(1, "micro-batches per optimizer step", ge=1)
    lr: float = opt(3e-4, "peak learning rate (AdamW)", gt=0)
    min_lr_ratio: float = opt(0.1, "cosine floor as a fraction of --lr", ge=0, le=1)
    warmup_steps: int = opt(20, "linear warmup steps", ge=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = opt(0.95, "AdamW beta2 (EAGLE-3 paper: 0.95)", ge=0, lt=1)
    grad_clip: float = opt(0.5, "max gradient norm (EAGLE-3 paper: 0.5)", gt=0)
    ttt_steps: int = opt(7, "unrolled training-time-test steps", ge=1)
    ttt_decay: float = opt(0.8, "weight of step k is decay**k", gt=0, le=1)
    target_temperature: float = opt(1.0, "temperature of the target distribution the drafter learns "
                                    "(1 = forward KL to q; 0 = one-hot on the target's argmax)", ge=0)
    lk_weight: float = opt(0.0, "weight of the LK loss -log(sum min(p, q)) added to the KL (acceptance-aware, "
                           "arXiv 2602.23881); 0 = KL only", ge=0)
    max_len: int = opt(1024, "samples are truncated to this many tokens", ge=3)
    val_fraction: float = opt(0.05, "share of samples held out for validation", ge=0, lt=1)
    seed: int = opt(0, "seed for init, split and order")
    num_layers: int = opt(1, "drafter decoder layers", ge=1)
    norm_before_residual: bool = opt(False, "residual taken after hidden_norm (some released checkpoints)")
    fc_norm: bool = opt(False, "per-slot RMSNorm on the fc input")
    init: str = opt("random", "drafter init: random, head (lm_head rows + final norm from the target), "
                    "target (head + the decoder layer after the deepest captured point, fc selecting that slot)",
                    choices=INITS)
    freeze_head: bool = opt(False, "keep lm_head fixed (use with --init head/target): fewer trained weights, faster steps")
    eval_every: int = opt(0, "validate every N steps (0 = at the end of each epoch and of training)", ge=0)
    save_every: int = opt(50, "save resumable state every N steps", ge=1)
    log_every: int = opt(1, "write a metrics row every N steps", ge=1)
    nan_policy: str = opt("skip", "non-finite batch: skip (counted) or stop (error naming the step)", choices=("skip", "stop"))
    max_skipped_fraction: float = opt(0.05, "fail the run when more than this share of its steps were skipped", ge=0, le=1)
    device: str = opt("auto", "auto, cpu, cuda, cuda:N (torchrun: cuda:LOCAL_RANK)")
    resume: bool = opt(False, "continue from --out/state")
    json: bool = opt(False, "print the final metrics as JSON")


_RESUME_FREE = {"resume", "json", "device", "log_every"}


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed + 7919)
    perm = torch.randperm(n, generator=g).tolist()
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 and n > 1 else 0
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def lr_at(step: int, cfg: TrainConfig, total: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def global_batch(train_idx: list[int], step: int, per_step: int, seed: int) -> list[int]:
    """Sample ids of optimizer step `step`: a seeded permutation per epoch, read in order."""
    per_epoch = max(1, len(train_idx) // per_step)
    epoch, k = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(len(train_idx), generator=g).tolist()
    return [train_idx[i] for i in perm[k * per_step:(k + 1) * per_step]]


def build_drafter(cfg: TrainConfig, target, manifest: dict, vocab_ids: torch.Tensor, ds=None) -> Eagle3Drafter:
    torch.manual_seed(cfg.seed)
    names = manifest["points"]["names"]
    dcfg = DrafterConfig.from_target_config(
        target.config, draft_vocab_size=int(vocab_ids.numel()), num_aux=len(names),
        num_layers=cfg.num_layers, norm_before_residual=cfg.norm_before_residual, fc_norm=cfg.fc_norm)
    model = Eagle3Drafter(dcfg)
    model.load_target_embedding(target.model.get_input_embeddings().weight.detach().float().cpu())
    model.set_draft_vocab(vocab_ids)
    if cfg.init in ("head", "target"):
        init_head(model, target.model.get_output_embeddings().weight.detach().float().cpu(),
                  target.model.base_model.norm.weight.detach().float().cpu())
    if cfg.init == "target":
        scale = _deepest_slot_scale(ds, names) if cfg.fc_norm and ds is not None else 1.0  # only fc_norm needs it
        init_from_target_layer(model, target.model, names, scale)
    if cfg.freeze_head:
        model.lm_head.weight.requires_grad_(False)
    return model


def _deepest_slot_scale(ds, names: list[str]) -> float:
    """Median RMS of the deepest captured slot over a few samples (position 0's massive activation excluded)."""
    slot = deepest_layer_slot(names)
    rms = [ds[i]["features"][1:, slot].float().pow(2).mean(-1).sqrt() for i in range(min(8, len(ds)))]
    return float(torch.cat(rms).median())


class ArgmaxCache:
    """The dataset plus each sample's full-vocab target argmax, computed once per sample.

    The argmax scans the whole target vocabulary (49k rows on the default
    target): recomputing it every epoch costs more than a TTT step.
    """

    def __init__(self, ds, head_w: torch.Tensor):
        self.ds, self.head_w, self.cache = ds, head_w, {}

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        return self.get_batch([i])[0]

    def get_batch(self, ids: list[int]) -> list[dict]:
        """Samples `ids` (an online dataset computes them in one target forward)."""
        items = self.ds.get_batch(ids) if hasattr(self.ds, "get_batch") else [self.ds[i] for i in ids]
        for i, item in zip(ids, items):
            if i not in self.cache:
                th = item["target_hidden"].to(self.head_w.device, torch.float32)  # [T, Ht]
                self.cache[i] = target_full_argmax(th, self.head_w).cpu()  # [T]
        return [{**item, "target_argmax": self.cache[i]} for i, item in zip(ids, items)]


def _micro_batch_loss(model, batch: dict, head_w: torch.Tensor, cfg: TrainConfig, n_global: torch.Tensor,
                      world: int, device) -> tuple[torch.Tensor, list, list, float]:
    """`model`: a drafter, or the (DDP-wrapped) `CallThrough` of one whose forward is `ttt_forward`."""
    fwd = functools.partial(ttt_forward, model) if isinstance(model, Eagle3Drafter) else model
    feats = batch["features"].to(device=device, dtype=torch.float32).flatten(2)  # [B, T, P*H]
    out = fwd(feats, batch["input_ids"].to(device), batch["target_hidden"].to(device, torch.float32),
              head_w, loss_mask=batch["loss_mask"].to(device), attention_mask=batch["attention_mask"].to(device),
              target_argmax=batch["target_argmax"].to(device) if "target_argmax" in batch else None,
              steps=cfg.ttt_steps, decay=cfg.ttt_decay, target_temperature=cfg.target_temperature,
              lk_weight=cfg.lk_weight)
    total = sum(cfg.ttt_decay ** k * loss_k * n_k for k, (loss_k, n_k) in enumerate(zip(out.step_losses, out.counts)))
    # sum of CE over the global batch / N_global, times world (DDP divides the summed gradients by world)
    loss = total * world / n_global.clamp(min=1)
    return loss, out.correct, out.counts, float(total.detach())


def _finite(batch: dict) -> bool:
    return bool(torch.isfinite(batch["features"]).all() and torch.isfinite(batch["target_hidden"]).all())


def train_step(model, opt, ds, ids: list[int], head_w, cfg: TrainConfig, dd: Dist, device) -> dict:
    """One optimizer step over the global batch `ids` (this rank's share, in micro-batches).

    `model` is the (DDP-wrapped) TTT module; DDP all-reduces during the last micro-batch's backward."""
    per_rank = len(ids) // dd.world
    mine = ids[dd.rank * per_rank:(dd.rank + 1) * per_rank]
    micro = [mine[i:i + cfg.batch_size] for i in range(0, len(mine), cfg.batch_size)]
    batches = [collate(ds.get_batch(m)) for m in micro]
    bad = [j for j, b in enumerate(batches) if not _finite(b)]
    flag = dd.all_sum(torch.tensor(float(len(bad))))
    if float(flag) > 0:
        return {"skipped": True}
    n_local = sum(float((b["loss_mask"] & b["attention_mask"]).sum()) for b in batches)
    n_global = dd.all_sum(torch.tensor(n_local, device=device))
    opt.zero_grad(set_to_none=True)
    k = cfg.ttt_steps
    correct, counts, loss_sum, toks = torch.zeros(k), torch.zeros(k), 0.0, 0
    for j, b in enumerate(batches):
        with dd.no_sync(model, sync=j == len(batches) - 1):
            loss, c, n, s = _micro_batch_loss(model, b, head_w, cfg, n_global, dd.world, device)
            loss.backward()
        correct += torch.tensor([float(x) for x in c])
        counts += torch.tensor([float(x) for x in n])
        loss_sum += s
        toks += int(b["attention_mask"].sum())
    gnorm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
    if not torch.isfinite(gnorm):
        return {"skipped": True, "nonfinite_grad": True}
    opt.step()
    stats = dd.all_sum(torch.cat([correct, counts, torch.tensor([loss_sum, float(toks)])]))
    return {"loss": float(stats[2 * k]) / max(float(n_global), 1.0), "correct": stats[:k], "counts": stats[k:2 * k],
            "tokens": int(stats[2 * k + 1]), "grad_norm": float(gnorm)}


@torch.no_grad()
def evaluate(model, ds, idx: list[int], head_w, cfg: TrainConfig, device, dd: Dist) -> dict:
    model.eval()
    k = cfg.ttt_steps
    correct, counts, loss_sum, n_tok = torch.zeros(k), torch.zeros(k), 0.0, 0.0
    mine = idx[dd.rank::dd.world]
    for i in range(0, len(mine), cfg.batch_size):
        b = collate(ds.get_batch(mine[i:i + cfg.batch_size]))
        if not _finite(b):
            continue
        n = torch.tensor(1.0)
        _, c, cnt, s = _micro_batch_loss(model, b, head_w, cfg, n, 1, device)
        correct += torch.tensor([float(x) for x in c])
        counts += torch.tensor([float(x) for x in cnt])
        loss_sum += s
        n_tok += float((b["loss_mask"] & b["attention_mask"]).sum())
    stats = dd.all_sum(torch.cat([correct, counts, torch.tensor([loss_sum, n_tok])]))
    model.train()
    acc = [float(stats[j] / stats[k + j]) if stats[k + j] > 0 else 0.0 for j in range(k)]
    return {"loss": float(stats[2 * k] / max(float(stats[2 * k + 1]), 1.0)), "acc": acc}


def _check_resume_config(cfg: TrainConfig) -> None:
    p = cfg.out / "train.config.json"
    if not p.is_file():
        raise EaglewireError(f"{cfg.out}: --resume but no train.config.json there")
    old = json.loads(p.read_text())["config"]
    new = config_to_dict(cfg)
    diff = [k for k in new if k not in _RESUME_FREE and old.get(k) != new[k]]
    if diff:
        raise EaglewireError(f"{cfg.out}: --resume with a changed config ({', '.join(f'{k}: {old.get(k)!r} -> {new[k]!r}' for k in diff)}); "
                             "start a new --out or resume with the original options")


def _setup(cfg: TrainConfig, device):
    from eaglewire.data.manifest import manifest_hash
    from eaglewire.data.vocab import load_vocab
    from eaglewire.target.load import (
        fingerprint_mismatch,
        load_target,
        recorded_source,
        target_fingerprint,
    )

    if cfg.online:
        from eaglewire.training.online_features import setup_online

        return setup_online(cfg, device)
    if cfg.points or cfg.vocab_size:
        raise EaglewireError(f"{cfg.data}: --points and --vocab-size apply to --online only (extracted features "
                             "have their points and vocab)")
    ds = FeatureDataset(cfg.data, max_len=cfg.max_len)
    man = ds.manifest
    names = man["points"].get("names") or []
    if not names or any(n is None for n in names):
        raise EaglewireError(f"{cfg.data}: the feature slots have no physical labels ({names}); run "
                             f"`eaglewire doctor dataset {cfg.data} --target T` to identify them, then re-import with --points")
    if man.get("target_hidden", "final_norm") != "final_norm":
        raise EaglewireError(f"{cfg.data}: target_hidden holds {man['target_hidden']!r}, training needs the final-norm output "
                             "(re-import with --target so the final norm can be applied)")
    fp = man["target"].get("fingerprint") or {}
    if fp.get("unknown") and not cfg.target:
        raise EaglewireError(f"{cfg.data}: the dataset does not record which target made it (imported); pass --target")
    source = cfg.target or recorded_source(man["target"])
    target = load_target(source, device="cpu")
    diff = [] if fp.get("unknown") else fingerprint_mismatch(fp, target_fingerprint(target))
    if diff:
        raise EaglewireError(f"{cfg.data}: dataset was made from another target than {source!r} (fingerprint differs in {', '.join(diff)})")
    P, H = ds[0]["features"].shape[1:]
    if H != target.hidden_size or P != len(man["points"]["names"]):
        raise EaglewireError(f"{cfg.data}: features are [{P} x {H}] but the target has hidden size {target.hidden_size} "
                             f"and the manifest lists {len(man['points']['names'])} points")
    try:
        vocab = load_vocab(cfg.data)
    except FileNotFoundError as e:
        raise EaglewireError(f"{cfg.data}: no draft vocab (run `eaglewire data vocab {cfg.data}`)") from e
    prov = {"target": {"source": source, "fingerprint": target_fingerprint(target)},
            "target_fingerprint": target_fingerprint(target), "dataset": {"path": str(cfg.data), "manifest_sha": manifest_hash(cfg.data)},
            "chat_template_sha": man["chat_template_sha"], "vocab": man.get("vocab")}
    return ds, man, target, vocab, prov


def run_train(cfg: TrainConfig) -> dict:
    from eaglewire.infra.device import resolve_device

    check_ranges(cfg)  # also when built in code, not through the CLI
    dd = Dist(resolve_device(cfg.device))
    device = dd.device  # cuda:LOCAL_RANK under torchrun
    if not dd.main:  # rank 0 alone writes the run directory (and holds its lock)
        return _run_train(cfg, device, dd)
    from eaglewire.infra.locks import dir_lock

    with dir_lock(cfg.out, "train"):
        return _run_train(cfg, device, dd)


def _run_train(cfg: TrainConfig, device, dd: Dist) -> dict:
    if cfg.resume:
        _check_resume_config(cfg)
    elif (cfg.out / "state").exists() or (cfg.out / "drafter").exists():
        raise EaglewireError(f"{cfg.out}: already holds a training run; pass --resume or choose a new --out")
    ds, man, target, vocab, prov = _setup(cfg, device)
    train_idx, val_idx = split_indices(len(ds), cfg.val_fraction, cfg.seed)
    per_step = cfg.batch_size * cfg.grad_accum * dd.world
    if len(train_idx) < per_step:
        raise EaglewireError(f"{cfg.data}: {len(train_idx)} training samples, fewer than one global batch ({per_step})")
    total = cfg.max_steps or cfg.epochs * (len(train_idx) // per_step)
    if total < 1:
        raise EaglewireError(f"{cfg.data}: the run would take no optimizer step (--max-steps {cfg.max_steps}, "
                             f"--epochs {cfg.epochs}, {len(train_idx)} training samples)")
    model = build_drafter(cfg, target, man, vocab.selected, ds).to(device).train()
    head_w = target.model.get_output_embeddings().weight.detach().to(device, torch.float32)  # [V, Ht]
    del target
    if cfg.online:
        ds.place(device)
    ds = ArgmaxCache(ds, head_w)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    start, skipped = 0, 0
    if cfg.resume:
        meta = load_run_state(cfg.out, model, opt)
        start, skipped = meta["step"], meta.get("skipped", 0)
    if dd.main:
        cfg.out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg.out / "train.config.json", {"total_steps": total, "world_size": dd.world})
    log = MetricsLog(cfg.out, cfg.ttt_steps, start if cfg.resume else None, dd.main)
    net = dd.wrap(CallThrough(model, ttt_forward))  # DDP under torchrun
    val = _loop(cfg, net, opt, ds, train_idx, val_idx, head_w, dd, device, log, start, total, per_step, skipped)
    del net  # before dd.close(): see Dist.close
    if dd.main:
        prov.update(training={"config": config_to_dict(cfg), "total_steps": total, "world_size": dd.world,
                              "skipped_batches": val.pop("skipped")}, validation=val,
                    # the held-out split, so the doctor can evaluate on samples never trained on
                    split={"dataset_manifest_sha": prov["dataset"]["manifest_sha"], "num_samples": len(ds),
                           "val_indices": val_idx})
        save_checkpoint(cfg.out / "drafter", model, man["points"]["names"], man["target"]["fingerprint"]["num_layers"], prov)
    log.close()
    dd.close()
    return {"drafter": str(cfg.out / "drafter"), "steps": total, "validation": val}


def _loop(cfg, net, opt, ds, train_idx, val_idx, head_w, dd, device, log, start, total, per_step, skipped) -> dict:
    model = unwrap(net)
    per_epoch = max(1, len(train_idx) // per_step)
    bar = tqdm(total=total, initial=start, desc="train", unit="step", disable=not dd.main, dynamic_ncols=True)
    val: dict = {}
    for step in range(start, total):
        lr = lr_at(step, cfg, total)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        r = train_step(net, opt, ds, global_batch(train_idx, step, per_step, cfg.seed), head_w, cfg, dd, device)
        if r.get("skipped"):
            if cfg.nan_policy == "stop":
                raise EaglewireError(f"step {step}: non-finite values in the batch or its gradients (--nan-policy stop)")
            skipped += 1
        elif (step + 1) % cfg.log_every == 0 or step + 1 == total:
            acc = [float(c / n) if n > 0 else 0.0 for c, n in zip(r["correct"], r["counts"])]
            log.write({"split": "train", "step": step + 1, "epoch": step // per_epoch, "loss": r["loss"], "lr": lr,
                       "tokens_per_s": r["tokens"] / (time.perf_counter() - t0), "grad_norm": r["grad_norm"],
                       **{f"acc_{j}": a for j, a in enumerate(acc)}})
            bar.set_postfix(loss=f"{r['loss']:.3f}", acc0=f"{acc[0]:.3f}", skipped=skipped)
        bar.update(1)
        end_epoch = (step + 1) % per_epoch == 0
        if val_idx and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or (not cfg.eval_every and end_epoch)
                        or step + 1 == total):
            val = evaluate(model, ds, val_idx, head_w, cfg, device, dd)
            log.write({"split": "val", "step": step + 1, "epoch": step // per_epoch, "loss": val["loss"],
                       **{f"acc_{j}": a for j, a in enumerate(val["acc"])}})
        if dd.main and ((step + 1) % cfg.save_every == 0 or step + 1 == total):
            save_state(cfg.out, model, opt, step + 1, {"skipped": skipped})
        if _STEP_DELAY:
            time.sleep(_STEP_DELAY)
    bar.close()
    _check_skipped(cfg, skipped, total)
    if not val and val_idx:
        val = evaluate(model, ds, val_idx, head_w, cfg, device, dd)
    return {**val, "skipped": skipped}


def _check_skipped(cfg: TrainConfig, skipped: int, total: int) -> None:
    """A run that trained on (almost) nothing must not end as a success with a drafter written."""
    if skipped >= total:  # total >= 1: run_train refuses a run of no steps up front
        raise EaglewireError(f"{cfg.data}: no optimizer step was taken ({skipped} of {total} steps skipped for "
                             "non-finite features or gradients); no drafter written")
    if skipped / total > cfg.max_skipped_fraction:
        raise EaglewireError(f"{cfg.data}: {skipped} of {total} steps were skipped for non-finite features or gradients "
                             f"(more than --max-skipped-fraction {cfg.max_skipped_fraction}); no drafter written. "
                             "Check the dataset with `eaglewire doctor dataset`")


def register(app) -> None:
    from eaglewire.infra.options import build_command

    def run(cfg: TrainConfig) -> None:
        res = run_train(cfg)
        if int(os.environ.get("RANK", "0")) != 0:
            return
        if cfg.json:
            print(json.dumps(res, indent=2))
        else:
            v = res["validation"]
            accs = " ".join(f"{a:.3f}" for a in v.get("acc", []))
            print(f"drafter: {res['drafter']}  steps {res['steps']}  val loss {v.get('loss', float('nan')):.4f}  acc_0..k {accs}")

    build_command(app, "train", TrainConfig, run, "Train an EAGLE-3 drafter with training-time test (also under torchrun).")
