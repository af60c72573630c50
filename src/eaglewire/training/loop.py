"""Train an EAGLE-3 drafter with training-time test, single process or under torchrun (`--drafter p-eagle`:
the same loop, drafter and run, with P-EAGLE's loss in place of TTT: `peagle_train.py`).

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
  responses (`online_features.py`), sample for sample, so the losses are the same;
  `--engine vllm` asks a vLLM server holding the target for them (`online_vllm.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from tqdm import tqdm

from eaglewire.data.dataset import collate
from eaglewire.data.manifest import Manifest
from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.drafter.ttt import target_full_argmax, ttt_forward
from eaglewire.drafter.warmstart import deepest_layer_slot, init_from_target_layer, init_head
from eaglewire.infra.device import resolve_device
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import dir_lock
from eaglewire.infra.options import check_ranges, config_to_dict, save_config
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.targets.capture import decoder_stack
from eaglewire.training.config import TrainConfig, check_drafter_options
from eaglewire.training.dflash_train import run_dflash_train
from eaglewire.training.identity import check_ranks_agree, check_same_dataset, dataset_identity
from eaglewire.training.inputs import TrainInputs
from eaglewire.training.offline import setup_offline
from eaglewire.training.online_features import setup_online
from eaglewire.training.online_vllm import setup_online_vllm
from eaglewire.training.peagle_loss import draw_elements, peagle_forward
from eaglewire.training.peagle_train import (
    element_generator,
    peagle_choices,
    peagle_micro_loss,
    step_elements,
    trained_depths,
)
from eaglewire.training.precision import apply_precision, autocast, resolve_precision
from eaglewire.training.runstate import (
    MetricsLog,
    check_resume_config,
    load_optimizer_state,
    load_run_state,
    save_state,
)
from eaglewire.training.schedule import (
    check_skipped,
    finite_batch,
    global_batch,
    lr_at,
    split_indices,
    stop_hooks,
)
from eaglewire.training.select import Selector
from eaglewire.training.torchrun import CallThrough, Dist, unwrap


@dataclass
class Run:
    """A run's moving parts, built once by `_prepare` and read by every step of `_loop`."""

    cfg: TrainConfig
    dd: Dist  # ranks; dd.device is this rank's device
    net: torch.nn.Module | None  # the (DDP-wrapped) TTT module
    opt: torch.optim.Optimizer
    ds: ArgmaxCache
    head_w: torch.Tensor  # [V, Ht] the target's frozen head
    train_idx: list[int]
    val_idx: list[int]
    log: MetricsLog
    total: int  # optimizer steps of the whole run
    per_step: int  # samples per optimizer step over all ranks
    selector: Selector | None = None  # which weights become the drafter (--select)
    start: int = 0  # first step (> 0 when resumed)
    skipped: int = 0  # steps skipped for non-finite values so far
    peagle: dict | None = None  # --drafter p-eagle: its mask token and depths (peagle_train.peagle_choices)


def build_drafter(cfg: TrainConfig, target, manifest: Manifest, vocab_ids: torch.Tensor, ds=None,
                  mask_token_id: int | None = None) -> Eagle3Drafter:
    """The EAGLE-3 drafter, or with a mask token id the P-EAGLE one (the same weights plus `mask_hidden`)."""
    torch.manual_seed(cfg.seed)
    if cfg.fc_mix > 0 and (cfg.init != "target" or cfg.fc_norm or cfg.norm_before_fc):
        raise EaglewireError(f"--fc-mix {cfg.fc_mix}: needs --init target and no --fc-norm / --norm-before-fc (it "
                             "scales the other slots by their raw RMS against the deepest one's)")
    if cfg.fc_norm and cfg.norm_before_fc:
        raise EaglewireError("--fc-norm and --norm-before-fc: two ways to normalise the fc input; choose one")
    names = manifest.point_names
    try:  # a size the drafter cannot take (the target's own, or an option's) is one line, not a traceback
        dcfg = DrafterConfig.from_target_config(
            target.config, draft_vocab_size=int(vocab_ids.numel()), num_aux=len(names),
            num_layers=cfg.num_layers, norm_before_residual=cfg.norm_before_residual, fc_norm=cfg.fc_norm,
            norm_before_fc=cfg.norm_before_fc, norm_output=cfg.norm_output,
            **({"intermediate_size": cfg.intermediate_size} if cfg.intermediate_size else {}))
    except ValueError as e:
        raise EaglewireError(f"{cfg.data}: cannot build the drafter: {e}") from e
    model = Eagle3Drafter(dcfg) if mask_token_id is None else PEagleDrafter(dcfg, mask_token_id)
    model.load_target_embedding(target.model.get_input_embeddings().weight.detach().float().cpu())
    model.set_draft_vocab(vocab_ids)
    if cfg.init in ("head", "target"):
        init_head(model, target.model.get_output_embeddings().weight.detach().float().cpu(),
                  decoder_stack(target.model).norm.weight.detach().float().cpu())
    if cfg.init == "target":
        scale = 1.0  # a normalised fc input needs the deepest slot's scale restored by the fc selection
        if ds is not None and cfg.fc_norm:
            scale = _deepest_slot_scale(ds, names)
        elif ds is not None and cfg.norm_before_fc:
            scale = _concat_rms(ds)
        try:
            init_from_target_layer(model, target.model, names, scale)
        except ValueError as e:
            raise EaglewireError(f"--init target: {e}") from e
        if cfg.fc_mix > 0 and ds is not None:
            mix_other_slots(model, ds, names, cfg.fc_mix)
    if cfg.freeze_head:
        model.lm_head.weight.requires_grad_(False)
    return model


def _slot_rms(ds, slot: int) -> float:
    """Median RMS of one captured slot over a few samples (position 0's massive activation excluded)."""
    rms = [ds[i]["features"][1:, slot].float().pow(2).mean(-1).sqrt() for i in range(min(8, len(ds)))]
    return float(torch.cat(rms).median())


def _concat_rms(ds) -> float:
    """Median RMS of the whole fc input (all slots together), as `_slot_rms`: what norm_before_fc divides by."""
    rms = [ds[i]["features"][1:].flatten(1).float().pow(2).mean(-1).sqrt() for i in range(min(8, len(ds)))]
    return float(torch.cat(rms).median())


def _deepest_slot_scale(ds, names: list[str]) -> float:
    return _slot_rms(ds, deepest_layer_slot(names))


@torch.no_grad()
def mix_other_slots(model: Eagle3Drafter, ds, names: list[str], mix: float) -> None:
    """Random fc weights on the slots the warm start leaves at zero, each adding `mix` x the deepest slot's RMS.

    The warm start hands the layer the deepest slot alone; measured, the
    trained drafter then barely reads the other slots (shuffling them costs
    < 0.02 acceptance). Seeded random weights, scaled per slot by the slots'
    RMS so each contributes a set fraction, give them a gradient path from
    step one while the function stays close to the target layer's.
    """
    deep = deepest_layer_slot(names)
    ht = model.config.target_hidden_size
    r_deep = _slot_rms(ds, deep)
    fc = model.fc.weight  # [H, A*Ht]
    for j in range(len(names)):
        if j != deep:
            std = mix * r_deep / (_slot_rms(ds, j) * ht ** 0.5)
            fc[:, j * ht:(j + 1) * ht].normal_(0.0, std)


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
                      world: int, device, el=None) -> tuple[torch.Tensor, list, list, float]:
    """`model`: a drafter, or the (DDP-wrapped) `CallThrough` of one whose forward is `ttt_forward` (with `el`,
    a P-EAGLE draw, `peagle_forward`)."""
    if el is not None:
        return peagle_micro_loss(model, batch, el, head_w, cfg, n_global, world, device)
    fwd = functools.partial(ttt_forward, model) if isinstance(model, Eagle3Drafter) else model
    feats = batch["features"].to(device=device, dtype=torch.float32).flatten(2)  # [B, T, P*H]
    with autocast(resolve_precision(cfg.precision, device), device):
        out = fwd(feats, batch["input_ids"].to(device), batch["target_hidden"].to(device, torch.float32),
                  head_w, loss_mask=batch["loss_mask"].to(device), attention_mask=batch["attention_mask"].to(device),
                  target_argmax=batch["target_argmax"].to(device) if "target_argmax" in batch else None,
                  steps=cfg.ttt_steps, decay=cfg.ttt_decay, target_temperature=cfg.target_temperature,
                  lk_weight=cfg.lk_weight)
    total = sum(cfg.ttt_decay ** k * loss_k.float() * n_k for k, (loss_k, n_k) in enumerate(zip(out.step_losses, out.counts)))
    # sum of CE over the global batch / N_global, times world (DDP divides the summed gradients by world)
    loss = total * world / n_global.clamp(min=1)
    return loss, out.correct, out.counts, float(total.detach())


def add_feature_noise(feats: torch.Tensor, scale: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Uniform noise of +-`scale` x each token's per-slot RMS on the target features.

    Serving feeds the drafter features of the target's own (accepted) tokens, but
    the drafter's errors compound over a round; EAGLE trains on noisy features
    so the fc layer does not rely on exact values. Scaling by the slot's RMS
    keeps one `scale` meaningful for shallow and deep layers alike.
    """
    rms = feats.float().pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, P, 1]
    u = torch.rand(feats.shape, generator=gen, dtype=torch.float32).to(feats.device)  # [B, T, P, H]
    return feats + ((u * 2 - 1) * scale * rms).to(feats.dtype)


def train_step(model, opt, ds, ids: list[int], head_w, cfg: TrainConfig, dd: Dist, device, step: int = 0) -> dict:
    """One optimizer step over the global batch `ids` (this rank's share, in micro-batches).

    `model` is the (DDP-wrapped) TTT module; DDP all-reduces during the last micro-batch's backward."""
    per_rank = len(ids) // dd.world
    mine = ids[dd.rank * per_rank:(dd.rank + 1) * per_rank]
    micro = [mine[i:i + cfg.batch_size] for i in range(0, len(mine), cfg.batch_size)]
    batches = [collate(ds.get_batch(m)) for m in micro]
    if cfg.feature_noise > 0:  # seeded by step and rank: a resumed run draws the same noise
        gen = torch.Generator().manual_seed((cfg.seed * 1000003 + step) * 64 + dd.rank)
        for b in batches:
            b["features"] = add_feature_noise(b["features"], cfg.feature_noise, gen)
    bad = [j for j, b in enumerate(batches) if not finite_batch(b)]
    flag = dd.all_sum(torch.tensor(float(len(bad))))
    if float(flag) > 0:
        return {"skipped": True}
    if cfg.drafter == "p-eagle":  # COD elements drawn first: the step's loss is normalised by their count
        if (drawn := step_elements(batches, cfg, step, dd)) is None:
            return {"skipped": True}
        batches, els, n_local = drawn
    else:
        els, n_local = [None] * len(batches), sum(float((b["loss_mask"] & b["attention_mask"]).sum()) for b in batches)
    n_global = dd.all_sum(torch.tensor(n_local, device=device))
    opt.zero_grad(set_to_none=True)
    k = trained_depths(cfg)
    correct, counts, loss_sum, toks = torch.zeros(k), torch.zeros(k), 0.0, 0
    for j, (b, el) in enumerate(zip(batches, els)):
        with dd.no_sync(model, sync=j == len(batches) - 1):
            loss, c, n, s = _micro_batch_loss(model, b, head_w, cfg, n_global, dd.world, device, el)
            loss.backward()
        correct += torch.tensor([float(x) for x in c])
        counts += torch.tensor([float(x) for x in n])
        loss_sum += s
        toks += int(b["attention_mask"].sum())
    gnorm = dd.scalar(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip))
    if not torch.isfinite(gnorm):
        return {"skipped": True, "nonfinite_grad": True}
    opt.step()
    stats = dd.all_sum(torch.cat([correct, counts, torch.tensor([loss_sum, float(toks)])]))
    return {"loss": float(stats[2 * k]) / max(float(n_global), 1.0), "correct": stats[:k], "counts": stats[k:2 * k],
            "tokens": int(stats[2 * k + 1]), "grad_norm": float(gnorm)}


@torch.no_grad()
def evaluate(model, ds, idx: list[int], head_w, cfg: TrainConfig, device, dd: Dist) -> dict:
    model.eval()
    k, peagle = trained_depths(cfg), cfg.drafter == "p-eagle"
    gen = element_generator(cfg.seed, 0, dd.rank, "val") if peagle else None  # the same elements every validation
    correct, counts, loss_sum, n_tok = torch.zeros(k), torch.zeros(k), 0.0, 0.0
    mine = idx[dd.rank::dd.world]
    for i in range(0, len(mine), cfg.batch_size):
        b = collate(ds.get_batch(mine[i:i + cfg.batch_size]))
        if not finite_batch(b):
            continue
        el = draw_elements(b["loss_mask"], b["attention_mask"], k, generator=gen) if peagle else None
        if el is not None and not el.trained:
            continue
        n = torch.tensor(1.0)
        _, c, cnt, s = _micro_batch_loss(model, b, head_w, cfg, n, 1, device, el)
        correct += torch.tensor([float(x) for x in c])
        counts += torch.tensor([float(x) for x in cnt])
        loss_sum += s
        n_tok += float(el.trained) if peagle else float((b["loss_mask"] & b["attention_mask"]).sum())
    stats = dd.all_sum(torch.cat([correct, counts, torch.tensor([loss_sum, n_tok])]))
    model.train()
    acc = [float(stats[j] / stats[k + j]) if stats[k + j] > 0 else 0.0 for j in range(k)]
    return {"loss": float(stats[2 * k] / max(float(stats[2 * k + 1]), 1.0)), "acc": acc}


def _setup(cfg: TrainConfig, device, held: ExitStack):
    """The run's inputs; what they hold for the whole run (a vLLM capture server: online_vllm.py) goes in `held`."""
    if cfg.online and cfg.engine == "vllm":
        return setup_online_vllm(cfg, held)
    return setup_online(cfg, device) if cfg.online else setup_offline(cfg)


def run_train(cfg: TrainConfig) -> dict:
    check_ranges(cfg)  # also when built in code, not through the CLI
    if check_drafter_options(cfg) == "dflash":
        return run_dflash_train(cfg)
    dd = Dist(resolve_device(cfg.device), cfg.parallel)  # dd.device: cuda:LOCAL_RANK under torchrun
    if not dd.main:  # rank 0 alone writes the run directory (and holds its lock)
        with ExitStack() as held:
            return _run_train(cfg, dd, held)

    with dir_lock(cfg.out, "train"), ExitStack() as held:
        return _run_train(cfg, dd, held)


def _run_train(cfg: TrainConfig, dd: Dist, held: ExitStack) -> dict:
    recorded = None
    if cfg.resume:
        recorded = check_resume_config(cfg)
    elif (cfg.out / "state").exists() or (cfg.out / "drafter").exists():
        raise EaglewireError(f"{cfg.out}: already holds a training run; pass --resume or choose a new --out")
    inputs = _setup(cfg, dd.device, held)
    inputs.identity = dataset_identity(cfg.data, inputs)
    check_ranks_agree(dd.gather(inputs.identity), cfg.data)
    if cfg.resume and recorded is not None:  # nothing is written before this refusal
        check_same_dataset(cfg.data, cfg.out, recorded, inputs.identity)
    run = _prepare(cfg, dd, inputs)
    val = _loop(run)
    model = unwrap(run.net)
    if dd.fsdp:  # every rank gathers; rank 0 writes a plain drafter of the whole weights
        whole, _ = dd.full_states(model, run.opt)
        model = PEagleDrafter(model.config, model.mask_token_id) if run.peagle else Eagle3Drafter(model.config)
        model.load_state_dict({k: v.cpu() for k, v in whole.items()}, strict=True)
    run.net = None  # drop the DDP wrapper before dd.close(): see Dist.close
    selected = {"by": "last", "step": run.total}
    if dd.main:
        skipped, last = val.pop("skipped"), dict(val)
        if (selected := run.selector.apply(model, run.total))["by"] != "last":
            val = dict(run.selector.best["validation"])
        prov = dataclasses.replace(
            inputs.prov, validation=val,
            training={"config": config_to_dict(cfg), "total_steps": run.total, "world_size": dd.world,
                      "skipped_batches": skipped, "selected": selected,
                      "last_validation": last, **({"drafter": "p-eagle", "peagle": run.peagle} if run.peagle else {})},
            # the held-out split, so the doctor can evaluate on samples never trained on
            split={"dataset_manifest_sha": (inputs.prov.dataset or {}).get("manifest_sha"), "num_samples": len(run.ds),
                   "val_indices": run.val_idx})
        save_checkpoint(cfg.out / "drafter", model, prov, depths=cfg.parallel_depths)
    run.log.close()
    dd.close()
    return {"drafter": str(cfg.out / "drafter"), "steps": run.total, "validation": val, "selected": selected,
            **({"drafter_kind": "p-eagle", "peagle": run.peagle} if run.peagle else {})}


def _prepare(cfg: TrainConfig, dd: Dist, inputs: TrainInputs) -> Run:
    """The split, the step count, the drafter (resumed state loaded) and its optimizer and log."""
    train_idx, val_idx = split_indices(len(inputs.ds), cfg.val_fraction, cfg.seed)
    if cfg.max_train_samples and cfg.max_train_samples < len(train_idx):
        g = torch.Generator().manual_seed(cfg.seed + 104729)
        train_idx = sorted(train_idx[i] for i in torch.randperm(len(train_idx), generator=g)[:cfg.max_train_samples].tolist())
    per_step = cfg.batch_size * cfg.grad_accum * dd.world
    if len(train_idx) < per_step:
        raise EaglewireError(f"{cfg.data}: {len(train_idx)} training samples, fewer than one global batch ({per_step})")
    total = cfg.max_steps or cfg.epochs * (len(train_idx) // per_step)
    if total < 1:
        raise EaglewireError(f"{cfg.data}: the run would take no optimizer step (--max-steps {cfg.max_steps}, "
                             f"--epochs {cfg.epochs}, {len(train_idx)} training samples)")
    mask, peagle = peagle_choices(cfg, inputs, train_idx) if cfg.drafter == "p-eagle" else (None, None)
    device = dd.device
    apply_precision(cfg.precision, device)
    model = build_drafter(cfg, inputs.target, inputs.manifest, inputs.vocab.selected, inputs.ds, mask).to(device).train()
    head_w = inputs.target.model.get_output_embeddings().weight.detach().to(device, torch.float32)  # [V, Ht]
    inputs.target = None  # only its head is used from here on
    if cfg.online:
        inputs.ds.place(device)
    start, skipped = 0, 0
    ds = ArgmaxCache(inputs.ds, head_w)
    selector = Selector(cfg.select, cfg.select_depth, ds, val_idx, head_w)
    if dd.fsdp and cfg.select != "last":
        raise EaglewireError(f"--select {cfg.select}: keeps the best weights on rank 0 alone, which --parallel fsdp "
                             "does not hold whole; use --parallel ddp, or --select last")
    meta = load_run_state(cfg.out, model) if cfg.resume else None  # whole weights, before any sharding
    net = dd.wrap(CallThrough(model, peagle_forward if peagle else ttt_forward))  # DDP or FSDP2 under torchrun
    # after the wrap: FSDP2 replaces the parameters with their shards, which the optimizer must hold
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    if meta is not None:
        load_optimizer_state(cfg.out, opt, dd.load_optimizer)
        selector.restore(cfg.out / "state", meta)
        start, skipped = meta["step"], meta["skipped"]
        if start > total:
            raise EaglewireError(f"{cfg.out / 'state' / 'meta.json'}: saved at step {start}, beyond this run's "
                                 f"{total} steps (the saved state is damaged, or --max-steps shrank)")
    if dd.main:
        cfg.out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg.out / "train.config.json", {"total_steps": total, "world_size": dd.world,
                                                         "dataset": inputs.identity, **({"peagle": peagle} if peagle else {})})
    log = MetricsLog(cfg.out, trained_depths(cfg), start if cfg.resume else None, dd.main)
    return Run(cfg=cfg, dd=dd, net=net, opt=opt, ds=ds, head_w=head_w, train_idx=train_idx, val_idx=val_idx, log=log,
               total=total, per_step=per_step, selector=selector, start=start, skipped=skipped, peagle=peagle)


def _loop(run: Run) -> dict:
    """Steps `run.start` .. `run.total`: train, log, validate and save on their schedules; returns the last validation."""
    cfg, dd, model = run.cfg, run.dd, unwrap(run.net)
    per_epoch = max(1, len(run.train_idx) // run.per_step)
    val: dict = {}
    # closed on an error too, so the one-line error starts its own line
    with tqdm(total=run.total, initial=run.start, desc="train", unit="step", disable=not dd.main,
              dynamic_ncols=True) as bar:
        for step in range(run.start, run.total):
            lr = lr_at(step, cfg, run.total)
            for g in run.opt.param_groups:
                g["lr"] = lr
            t0 = time.perf_counter()
            ids = global_batch(run.train_idx, step, run.per_step, cfg.seed)
            r = train_step(run.net, run.opt, run.ds, ids, run.head_w, cfg, dd, dd.device, step)
            if r.get("skipped"):
                if cfg.nan_policy == "stop":
                    raise EaglewireError(f"step {step}: non-finite values in the batch or its gradients (--nan-policy stop)")
                run.skipped += 1
            elif (step + 1) % cfg.log_every == 0 or step + 1 == run.total:
                acc = [float(c / n) if n > 0 else 0.0 for c, n in zip(r["correct"], r["counts"])]
                run.log.write({"split": "train", "step": step + 1, "epoch": step // per_epoch, "loss": r["loss"], "lr": lr,
                               "tokens_per_s": r["tokens"] / (time.perf_counter() - t0), "grad_norm": r["grad_norm"],
                               **{f"acc_{j}": a for j, a in enumerate(acc)}})
                bar.set_postfix(loss=f"{r['loss']:.3f}", acc0=f"{acc[0]:.3f}", skipped=run.skipped)
            bar.update(1)
            end_epoch = (step + 1) % per_epoch == 0
            if run.val_idx and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or (not cfg.eval_every and end_epoch)
                                or step + 1 == run.total):
                with dd.whole(run.net):
                    val = _validate(run, model, step, per_epoch)
            if (step + 1) % cfg.save_every == 0 or step + 1 == run.total:
                states = dd.full_states(model, run.opt)  # every rank: FSDP2 gathers the shards
                if dd.main:
                    save_state(cfg.out, *states, step + 1, {"skipped": run.skipped}, run.selector)
            stop_hooks(step)
    check_skipped(cfg, run.skipped, run.total)
    if not val and run.val_idx:
        with dd.whole(run.net):
            val = evaluate(model, run.ds, run.val_idx, run.head_w, cfg, dd.device, dd)
    return {**val, "skipped": run.skipped}


def _validate(run: Run, model, step: int, per_epoch: int) -> dict:
    """The validation loss and per-step accuracy (all ranks), the acceptance walk when selecting by it (rank 0)."""
    val = evaluate(model, run.ds, run.val_idx, run.head_w, run.cfg, run.dd.device, run.dd)
    if run.dd.main:
        if run.selector.by == "acceptance":
            val.update(run.selector.acceptance(model))
        run.selector.consider(step + 1, model, val)
    run.log.write({"split": "val", "step": step + 1, "epoch": step // per_epoch, "loss": val["loss"],
                   **{f"acc_{j}": a for j, a in enumerate(val["acc"])},
                   "mean_acceptance_length": val.get("mean_acceptance_length", "")})
    return val
