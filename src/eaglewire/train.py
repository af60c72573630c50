"""Train an EAGLE-3 drafter with training-time test, single process or under torchrun.

Exactness choices:
- the loss of a step is normalised by the number of loss-masked tokens of the
  whole *global* batch (all micro-batches, all ranks), computed up front from
  the data. Each micro-batch contributes sum-of-CE / N_global, so gradient
  accumulation and DDP (gradients averaged over ranks, hence x world size)
  give the same update as one process with the whole batch;
- the sample order is a pure function of (seed, step) (a seeded permutation
  per epoch) and the drafter has no dropout, so no RNG state is needed:
  model, optimizer and step are the resumable state, and a killed and resumed
  run reads the same samples in the same order and follows the same losses
  (both tested).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from .atomic import atomic_dir
from .config import check_ranges, config_to_dict, opt, save_config
from .data.dataset import FeatureDataset, collate
from .drafter import DrafterConfig, Eagle3Drafter
from .drafter.checkpoint import load_state, save_checkpoint
from .drafter.ttt import target_full_argmax, ttt_forward
from .drafter.warmstart import INITS, deepest_layer_slot, init_from_target_layer, init_head
from .errors import EaglewireError

_STEP_DELAY = float(os.environ.get("EAGLEWIRE_STEP_DELAY", "0"))  # lets crash tests kill a real run


@dataclass
class TrainConfig:
    data: Path = opt(help="dataset directory (eaglewire data build)")
    out: Path = opt(help="run directory: drafter/ (the checkpoint), state/, metrics.csv, tb/")
    target: str = opt("", "target; default: the one recorded in the dataset manifest (must match its fingerprint)")
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


class Dist:
    """torchrun awareness: rank/world from the environment, gloo on CPU, nccl on CUDA."""

    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def average_grads(self, params) -> None:
        if self.world == 1:
            return
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world


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
        item = self.ds[i]
        if i not in self.cache:
            th = item["target_hidden"].to(self.head_w.device, torch.float32)
            self.cache[i] = target_full_argmax(th, self.head_w).cpu()  # [T]
        return {**item, "target_argmax": self.cache[i]}


def _micro_batch_loss(model, batch: dict, head_w: torch.Tensor, cfg: TrainConfig, n_global: torch.Tensor,
                      world: int, device) -> tuple[torch.Tensor, list, list, float]:
    feats = batch["features"].to(device=device, dtype=torch.float32).flatten(2)  # [B, T, P*H]
    out = ttt_forward(model, feats, batch["input_ids"].to(device), batch["target_hidden"].to(device, torch.float32),
                      head_w, loss_mask=batch["loss_mask"].to(device), attention_mask=batch["attention_mask"].to(device),
                      target_argmax=batch["target_argmax"].to(device) if "target_argmax" in batch else None,
                      steps=cfg.ttt_steps, decay=cfg.ttt_decay, target_temperature=cfg.target_temperature)
    total = sum(cfg.ttt_decay ** k * loss_k * n_k for k, (loss_k, n_k) in enumerate(zip(out.step_losses, out.counts)))
    # sum of CE over the global batch / N_global, times world (DDP averages gradients)
    loss = total * world / n_global.clamp(min=1)
    return loss, out.correct, out.counts, float(total.detach())


def _finite(batch: dict) -> bool:
    return bool(torch.isfinite(batch["features"]).all() and torch.isfinite(batch["target_hidden"]).all())


def train_step(model, opt, ds, ids: list[int], head_w, cfg: TrainConfig, dd: Dist, device) -> dict:
    """One optimizer step over the global batch `ids` (this rank's share, in micro-batches)."""
    per_rank = len(ids) // dd.world
    mine = ids[dd.rank * per_rank:(dd.rank + 1) * per_rank]
    micro = [mine[i:i + cfg.batch_size] for i in range(0, len(mine), cfg.batch_size)]
    batches = [collate([ds[i] for i in m]) for m in micro]
    bad = [j for j, b in enumerate(batches) if not _finite(b)]
    flag = dd.all_sum(torch.tensor(float(len(bad))))
    if float(flag) > 0:
        return {"skipped": True}
    n_local = sum(float((b["loss_mask"] & b["attention_mask"]).sum()) for b in batches)
    n_global = dd.all_sum(torch.tensor(n_local, device=device))
    opt.zero_grad(set_to_none=True)
    k = cfg.ttt_steps
    correct, counts, loss_sum, toks = torch.zeros(k), torch.zeros(k), 0.0, 0
    for b in batches:
        loss, c, n, s = _micro_batch_loss(model, b, head_w, cfg, n_global, dd.world, device)
        loss.backward()
        correct += torch.tensor([float(x) for x in c])
        counts += torch.tensor([float(x) for x in n])
        loss_sum += s
        toks += int(b["attention_mask"].sum())
    dd.average_grads(p for p in model.parameters() if p.requires_grad)
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
        b = collate([ds[j] for j in mine[i:i + cfg.batch_size]])
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


class MetricsLog:
    """metrics.csv (truncated to the resumed step, so a resumed run has one clean trajectory) + TensorBoard."""

    def __init__(self, out: Path, k: int, resume_step: int | None, enabled: bool):
        self.enabled = enabled
        self.path = out / "metrics.csv"
        self.fields = ["split", "step", "epoch", "loss", *[f"acc_{j}" for j in range(k)], "lr", "tokens_per_s", "grad_norm"]
        if not enabled:
            return
        rows = []
        if resume_step is not None and self.path.exists():
            with open(self.path) as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, self.fields)
            w.writeheader()
            w.writerows(rows)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(out / "tb"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields).writerow({k: row.get(k, "") for k in self.fields})
        for k, v in row.items():
            if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                self.tb.add_scalar(f"{row['split']}/{k}", v, row["step"])

    def close(self):
        if self.enabled:
            self.tb.close()


def _save_state(out: Path, model, opt, step: int, extra: dict) -> None:
    from safetensors.torch import save_file

    with atomic_dir(out / "state") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, **extra}))


def _load_state(out: Path, model, opt) -> dict:
    import json

    st = out / "state"
    if not (st / "meta.json").is_file():
        raise EaglewireError(f"{out}: --resume but no saved state in {st}")
    model.load_state_dict(load_state(st / "model.safetensors"), strict=True)
    opt.load_state_dict(torch.load(st / "optimizer.pt", weights_only=True))
    return json.loads((st / "meta.json").read_text())


def _check_resume_config(cfg: TrainConfig) -> None:
    import json

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
    from .data.manifest import manifest_hash
    from .data.vocab import load_vocab
    from .targets import fingerprint_mismatch, load_target, recorded_source, target_fingerprint

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
    from .device import resolve_device

    check_ranges(cfg)  # also when built in code, not through the CLI
    device = resolve_device(cfg.device)
    dd = Dist(device)
    if dd.world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if not dd.main:  # rank 0 alone writes the run directory (and holds its lock)
        return _run_train(cfg, device, dd)
    from .locks import dir_lock

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
    ds = ArgmaxCache(ds, head_w)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    start, skipped = 0, 0
    if cfg.resume:
        meta = _load_state(cfg.out, model, opt)
        start, skipped = meta["step"], meta.get("skipped", 0)
    if dd.main:
        cfg.out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg.out / "train.config.json", {"total_steps": total, "world_size": dd.world})
    log = MetricsLog(cfg.out, cfg.ttt_steps, start if cfg.resume else None, dd.main)
    val = _loop(cfg, model, opt, ds, train_idx, val_idx, head_w, dd, device, log, start, total, per_step, skipped)
    if dd.main:
        prov.update(training={"config": config_to_dict(cfg), "total_steps": total, "world_size": dd.world,
                              "skipped_batches": val.pop("skipped")}, validation=val,
                    # the held-out split, so the doctor can evaluate on samples never trained on
                    split={"dataset_manifest_sha": prov["dataset"]["manifest_sha"], "num_samples": len(ds),
                           "val_indices": val_idx})
        save_checkpoint(cfg.out / "drafter", model, man["points"]["names"], man["target"]["fingerprint"]["num_layers"], prov)
    log.close()
    if dd.world > 1:
        dist.destroy_process_group()
    return {"drafter": str(cfg.out / "drafter"), "steps": total, "validation": val}


def _loop(cfg, model, opt, ds, train_idx, val_idx, head_w, dd, device, log, start, total, per_step, skipped) -> dict:
    per_epoch = max(1, len(train_idx) // per_step)
    bar = tqdm(total=total, initial=start, desc="train", unit="step", disable=not dd.main, dynamic_ncols=True)
    val: dict = {}
    for step in range(start, total):
        lr = lr_at(step, cfg, total)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        r = train_step(model, opt, ds, global_batch(train_idx, step, per_step, cfg.seed), head_w, cfg, dd, device)
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
            _save_state(cfg.out, model, opt, step + 1, {"skipped": skipped})
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
    import json

    from .config import build_command

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
