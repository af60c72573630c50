"""`eaglewire train --drafter dflash`: the DFlash block drafter on the same datasets as EAGLE-3.

What it shares with the EAGLE-3 loop (`loop.py`), so both read a run the same way: the split
(`split_indices`), the sample order (`global_batch`, a pure function of seed and step), the schedule
(`lr_at`), the run directory (train.config.json, metrics.csv, state/ and its resume checks, the dataset
identity) and the inputs (`offline.py` reads the target's embedding and head from its shards;
`--online` runs the target in the loop). What differs:

- the drafter reads the dataset's capture points as its `target_layer_ids` (z-lab id k = `layers.{k}.out`):
  they must all be decoder-layer outputs in ascending order, since no engine feeds `embed` or `final_norm`
  to a DFlash drafter and every engine concatenates the states in id order;
- the loss is `dflash_loss.dflash_forward` with soft targets (the target's distribution at `a+k-1`, read
  from the stored `target_hidden`: what greedy verification accepts), anchors drawn from a generator
  seeded by (seed, step), so a resumed run draws the same blocks and follows the same losses;
- a micro-batch's loss is its weighted mean over slots; micro-batches of one step are averaged;
- it runs in one process (no torchrun) and keeps the last weights (no `--select`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from safetensors import safe_open
from tqdm import tqdm

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids
from eaglewire.infra.device import resolve_device
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import dir_lock
from eaglewire.infra.options import config_to_dict, save_config
from eaglewire.infra.ranks import rank_world
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire.targets.points import Point, layer_out
from eaglewire.training.config import TrainConfig
from eaglewire.training.dflash_loss import default_gamma, dflash_forward
from eaglewire.training.identity import check_same_dataset, dataset_identity
from eaglewire.training.inputs import TrainInputs
from eaglewire.training.offline import setup_offline
from eaglewire.training.online_features import setup_online
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


@dataclass
class DRun:
    """A DFlash run's moving parts, built once by `_prepare`."""

    cfg: TrainConfig
    model: DFlashDrafter
    opt: torch.optim.Optimizer
    ds: object  # FeatureDataset or online_features.OnlineDataset
    embed_w: torch.Tensor  # [V, H] the target's frozen input embedding
    head_w: torch.Tensor  # [V, H] the target's frozen lm_head
    device: torch.device
    train_idx: list[int]
    val_idx: list[int]
    log: MetricsLog
    total: int
    start: int = 0
    skipped: int = 0


def dflash_ids(points: list[Point], where: str) -> list[int]:
    """z-lab target_layer_ids of capture points, or one line naming the point a DFlash drafter cannot read."""
    for p in points:
        if p.kind != "layer":
            raise EaglewireError(f"{where}: capture point {p.name}: a DFlash drafter reads decoder-layer outputs only "
                                 "(layers.k.out = z-lab id k); no engine feeds embed or final_norm to it: capture "
                                 "layers.k.out points instead")
    ids = [p.layer for p in points]
    if ids != sorted(set(ids)):
        raise EaglewireError(f"{where}: capture points {[p.name for p in points]}: a DFlash drafter needs them distinct "
                             "and in ascending layer order (engines concatenate target_layer_ids ascending)")
    return ids


def used_token_ids(ds) -> set[int]:
    """Every token id of the training data (input ids only: shards read without their features)."""
    if isinstance(ds, FeatureDataset):
        seen: set[int] = set()
        for s in ds.manifest.shards:
            with safe_open(str(ds.root / s["file"]), framework="pt") as f:
                seen.update(f.get_tensor("input_ids").unique().tolist())
        return seen
    return {t for it in ds.items for t in it[1]}


def loss_masks(ds) -> list[torch.Tensor]:
    """Every sample's loss mask (bool [T], truncated as the dataset truncates), read without the features."""
    if isinstance(ds, FeatureDataset):
        out = []
        for s in ds.manifest.shards:
            with safe_open(str(ds.root / s["file"]), framework="pt") as f:
                lm, offs = f.get_tensor("loss_mask").bool(), f.get_tensor("offsets").tolist()
            out += [lm[a:b][:ds.max_len] if ds.max_len else lm[a:b] for a, b in zip(offs, offs[1:])]
        return out
    return [torch.tensor(it[2][:ds.max_len], dtype=torch.bool) for it in ds.items]


def check_anchors(cfg: TrainConfig, ds, train_idx: list[int]) -> None:
    """Refuse, before anything is written, a run none of whose training samples holds a block: an answer token
    with room for `--block-size` tokens within `--max-len` (long prompts truncated away every answer)."""
    masks = loss_masks(ds)
    if not any(bool(masks[i][: max(len(masks[i]) - cfg.block_size + 1, 0)].any()) for i in train_idx):
        raise EaglewireError(f"{cfg.data}: no training sample has an answer token with room for a block of "
                             f"--block-size {cfg.block_size} within --max-len {cfg.max_len} (the prompts fill it); "
                             "raise --max-len")


def resolve_mask_token(cfg: TrainConfig, tokenizer, rows: int, used: set[int]) -> tuple[int, str]:
    """(mask token id, why): the id of the masked slots, a row of the target embedding (`rows` rows).

    Order: --mask-token-id; the tokenizer's mask token; the first embedding row past the tokenizer
    (z-lab's added `<|MASK|>` in a padded embedding); the highest special token id absent from the data
    (SmolLM2: 16 `<empty_output>`, a code-pretraining token a chat target never emits); the highest id absent
    from the data. A bonus token equal to the mask id stays lossless: verification decides, not the draft."""
    if cfg.mask_token_id >= 0:
        if cfg.mask_token_id >= rows:
            raise EaglewireError(f"--mask-token-id {cfg.mask_token_id}: outside the target's embedding rows "
                                 f"[0, {rows}) (the masked slots are embedded by the target)")
        return cfg.mask_token_id, "given by --mask-token-id"
    mask = getattr(tokenizer, "mask_token_id", None)
    if isinstance(mask, int) and 0 <= mask < rows:
        return mask, f"the tokenizer's mask token {tokenizer.mask_token!r}"
    if len(tokenizer) < rows:
        return len(tokenizer), (f"the first embedding row past the tokenizer's {len(tokenizer)} tokens (no token "
                                "uses it: z-lab's <|MASK|> slot)")
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}  # SmolLM2's 3..16 are special only here
    specials = set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
    for tid in sorted(specials, reverse=True):
        if 0 <= tid < rows and tid not in used:
            name = tokenizer.convert_ids_to_tokens(tid)
            return tid, (f"the highest special token id absent from the training data ({name!r}): the tokenizer "
                         "has no mask token and the embedding no spare row")
    absent = sorted(set(range(rows)) - used)
    if absent:
        return absent[-1], ("the highest token id absent from the training data: the tokenizer has no mask token, "
                            "the embedding no spare row, and every special token occurs in the data")
    raise EaglewireError(f"{cfg.data}: no mask token: the tokenizer has none, the embedding has no row past its "
                         "tokens and every token id occurs in the data; pass --mask-token-id")


def _setup(cfg: TrainConfig, device) -> TrainInputs:
    if cfg.online:
        return setup_online(cfg, device, need_vocab=False,
                            default_points=lambda n: [layer_out(k) for k in default_target_layer_ids(n, cfg.num_layers)])
    return setup_offline(cfg, need_vocab=False)


def drafter_config(cfg: TrainConfig, inputs: TrainInputs) -> tuple[DFlashConfig, dict]:
    """The drafter's config and the record of its DFlash choices (train.config.json and the checkpoint)."""
    where = str(cfg.data / "manifest.json") if not cfg.online else "--points"
    ids = dflash_ids(inputs.manifest.points, where)
    t = inputs.target
    rows = int(t.model.get_input_embeddings().weight.shape[0])
    mask, why = resolve_mask_token(cfg, t.tokenizer, rows, used_token_ids(inputs.ds))
    try:
        dcfg = DFlashConfig.from_target_config(t.config, mask_token_id=mask, block_size=cfg.block_size,
                                               num_layers=cfg.num_layers, target_layer_ids=ids)
        if cfg.intermediate_size:
            dcfg = dataclasses.replace(dcfg, intermediate_size=cfg.intermediate_size)
    except ValueError as e:
        raise EaglewireError(f"{cfg.data}: cannot build the DFlash drafter: {e}") from e
    gamma = cfg.loss_decay_gamma or default_gamma(cfg.block_size)
    rec = {"target_layer_ids": ids, "mask_token_id": mask, "mask_token_why": why, "block_size": cfg.block_size,
           "loss_decay_gamma": gamma, "num_anchors": cfg.num_anchors,
           "targets": "soft: the target's distribution at a+k-1 (target_hidden)"}
    return dcfg, rec


def run_dflash_train(cfg: TrainConfig) -> dict:
    _, world = rank_world()
    if world > 1:  # before any process group: one line, not a hung collective
        raise EaglewireError(f"--drafter dflash: trains in one process; torchrun started {world} ranks")
    with dir_lock(cfg.out, "train"):
        return _run(cfg, resolve_device(cfg.device))


def _run(cfg: TrainConfig, device: torch.device) -> dict:
    recorded = check_resume_config(cfg) if cfg.resume else None
    if not cfg.resume and ((cfg.out / "state").exists() or (cfg.out / "drafter").exists()):
        raise EaglewireError(f"{cfg.out}: already holds a training run; pass --resume or choose a new --out")
    inputs = _setup(cfg, device)
    dcfg, rec = drafter_config(cfg, inputs)
    inputs.identity = dataset_identity(cfg.data, inputs)
    if cfg.resume and recorded is not None:  # nothing is written before this refusal
        check_same_dataset(cfg.data, cfg.out, recorded, inputs.identity)
    run = _prepare(cfg, device, inputs, dcfg, rec)
    val = _loop(run)
    skipped = val.pop("skipped")
    prov = dataclasses.replace(
        inputs.prov, validation=val,
        training={"config": config_to_dict(cfg), "drafter": "dflash", "dflash": rec, "total_steps": run.total,
                  "world_size": 1, "skipped_batches": skipped, "selected": {"by": "last", "step": run.total}},
        split={"dataset_manifest_sha": (inputs.prov.dataset or {}).get("manifest_sha"), "num_samples": len(run.ds),
               "val_indices": run.val_idx})
    save_dflash_checkpoint(cfg.out / "drafter", run.model, prov)
    run.log.close()
    return {"drafter": str(cfg.out / "drafter"), "drafter_kind": "dflash", "steps": run.total, "validation": val,
            "selected": {"by": "last", "step": run.total}, "dflash": rec}


def _prepare(cfg: TrainConfig, device, inputs: TrainInputs, dcfg: DFlashConfig, rec: dict) -> DRun:
    """The split, the step count, the drafter (resumed state loaded), its optimizer and log."""
    train_idx, val_idx = split_indices(len(inputs.ds), cfg.val_fraction, cfg.seed)
    if cfg.max_train_samples and cfg.max_train_samples < len(train_idx):
        g = torch.Generator().manual_seed(cfg.seed + 104729)
        train_idx = sorted(train_idx[i] for i in torch.randperm(len(train_idx), generator=g)[:cfg.max_train_samples].tolist())
    per_step = cfg.batch_size * cfg.grad_accum
    if len(train_idx) < per_step:
        raise EaglewireError(f"{cfg.data}: {len(train_idx)} training samples, fewer than one global batch ({per_step})")
    total = cfg.max_steps or cfg.epochs * (len(train_idx) // per_step)
    if total < 1:
        raise EaglewireError(f"{cfg.data}: the run would take no optimizer step (--max-steps {cfg.max_steps}, "
                             f"--epochs {cfg.epochs}, {len(train_idx)} training samples)")
    check_anchors(cfg, inputs.ds, train_idx)
    apply_precision(cfg.precision, device)
    torch.manual_seed(cfg.seed)
    model = DFlashDrafter(dcfg).to(device).train()
    lm = inputs.target.model
    embed_w = lm.get_input_embeddings().weight.detach().to(device, torch.float32)  # [V, H]
    head_w = lm.get_output_embeddings().weight.detach().to(device, torch.float32)  # [V, H]
    inputs.target = None  # only its embedding and head are used from here on
    if cfg.online:
        inputs.ds.place(device)
    meta = load_run_state(cfg.out, model) if cfg.resume else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    start = skipped = 0
    if meta is not None:
        load_optimizer_state(cfg.out, opt)
        start, skipped = meta["step"], meta["skipped"]
        if start > total:
            raise EaglewireError(f"{cfg.out / 'state' / 'meta.json'}: saved at step {start}, beyond this run's "
                                 f"{total} steps (the saved state is damaged, or --max-steps shrank)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg.out / "train.config.json", {"total_steps": total, "world_size": 1,
                                                     "dataset": inputs.identity, "dflash": rec})
    log = MetricsLog(cfg.out, dcfg.block_size - 1, start if cfg.resume else None, True)
    return DRun(cfg=cfg, model=model, opt=opt, ds=inputs.ds, embed_w=embed_w, head_w=head_w, device=device,
                train_idx=train_idx, val_idx=val_idx, log=log, total=total, start=start, skipped=skipped)


def _samples(ds, ids: list[int]) -> list[dict]:
    """Samples `ids` (an online dataset computes them in one target forward)."""
    return ds.get_batch(ids) if hasattr(ds, "get_batch") else [ds[i] for i in ids]


def _has_anchor(b: dict, block_size: int) -> bool:
    return bool((b["loss_mask"] & b["attention_mask"].bool())[:, : max(b["input_ids"].shape[1] - block_size + 1, 0)].any())


def _block_loss(run: DRun, b: dict, gen: torch.Generator):
    """dflash_forward on one collated micro-batch (soft targets from target_hidden)."""
    cfg, dev = run.cfg, run.device
    am = b["attention_mask"].to(dev)
    with autocast(resolve_precision(cfg.precision, dev), dev):
        return dflash_forward(
            run.model, b["features"].to(dev, torch.float32).flatten(2), b["input_ids"].to(dev), run.embed_w,
            run.head_w, b["loss_mask"].to(dev) & am.bool(), num_anchors=cfg.num_anchors,
            gamma=cfg.loss_decay_gamma or None, attention_mask=am,
            target_hidden=b["target_hidden"].to(dev, torch.float32), generator=gen)


def step_generator(seed: int, step: int, split: str = "train") -> torch.Generator:
    """The anchors' generator: a pure function of (seed, step), so a resumed run draws the same blocks."""
    return torch.Generator().manual_seed((seed * 1000003 + step) * 2 + (split == "val"))


def train_step(run: DRun, ids: list[int], step: int) -> dict:
    """One optimizer step: micro-batches' slot-weighted losses averaged, then clipped AdamW."""
    cfg, k = run.cfg, run.model.config.block_size - 1
    batches = [collate(_samples(run.ds, ids[j:j + cfg.batch_size])) for j in range(0, len(ids), cfg.batch_size)]
    if not all(finite_batch(b) for b in batches):
        return {"skipped": True}
    batches = [b for b in batches if _has_anchor(b, k + 1)]
    if not batches:
        return {"skipped": True}
    gen = step_generator(cfg.seed, step)
    run.opt.zero_grad(set_to_none=True)
    correct, counts, loss_sum, toks = torch.zeros(k), torch.zeros(k), 0.0, 0
    for b in batches:
        out = _block_loss(run, b, gen)
        (out.loss / len(batches)).backward()
        correct += out.correct.detach().cpu()
        counts += out.count.detach().cpu()
        loss_sum += float(out.loss.detach()) / len(batches)
        toks += int(b["attention_mask"].sum())
    gnorm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    if not torch.isfinite(gnorm):
        return {"skipped": True}
    run.opt.step()
    return {"loss": loss_sum, "correct": correct, "counts": counts, "tokens": toks, "grad_norm": float(gnorm)}


def acceptance_length(acc: list[float]) -> float:
    """Mean of 1 + accepted per block, teacher-forced: slot k is accepted when slots 1..k all are, taking the
    per-slot accuracies as independent (a cumulative product; the decoder's `generate_block` measures it)."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau


@torch.no_grad()
def evaluate(run: DRun, step: int) -> dict:
    """Validation loss (weighted by counted slots), per-slot accuracy and the acceptance length they imply."""
    cfg, k = run.cfg, run.model.config.block_size - 1
    run.model.eval()
    gen = step_generator(cfg.seed, 0, "val")  # the same blocks at every validation: comparable scores
    correct, counts, loss_sum = torch.zeros(k), torch.zeros(k), 0.0
    for j in range(0, len(run.val_idx), cfg.batch_size):
        b = collate(_samples(run.ds, run.val_idx[j:j + cfg.batch_size]))
        if not finite_batch(b) or not _has_anchor(b, k + 1):
            continue
        out = _block_loss(run, b, gen)
        correct += out.correct.cpu()
        counts += out.count.cpu()
        loss_sum += float(out.loss) * float(out.count.sum())
    run.model.train()
    acc = [float(c / n) if n > 0 else 0.0 for c, n in zip(correct, counts)]
    return {"loss": loss_sum / max(float(counts.sum()), 1.0), "acc": acc, "mean_acceptance_length": acceptance_length(acc)}


def _loop(run: DRun) -> dict:
    """Steps `run.start` .. `run.total`: train, log, validate and save on their schedules."""
    cfg = run.cfg
    per_epoch = max(1, len(run.train_idx) // (cfg.batch_size * cfg.grad_accum))
    val: dict = {}
    with tqdm(total=run.total, initial=run.start, desc="train dflash", unit="step", dynamic_ncols=True) as bar:
        for step in range(run.start, run.total):
            lr = lr_at(step, cfg, run.total)
            for g in run.opt.param_groups:
                g["lr"] = lr
            t0 = time.perf_counter()
            r = train_step(run, global_batch(run.train_idx, step, cfg.batch_size * cfg.grad_accum, cfg.seed), step)
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
            if run.val_idx and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0)
                                or (not cfg.eval_every and (step + 1) % per_epoch == 0) or step + 1 == run.total):
                val = evaluate(run, step)
                run.log.write({"split": "val", "step": step + 1, "epoch": step // per_epoch, "loss": val["loss"],
                               **{f"acc_{j}": a for j, a in enumerate(val["acc"])},
                               "mean_acceptance_length": val["mean_acceptance_length"]})
            if (step + 1) % cfg.save_every == 0 or step + 1 == run.total:
                save_state(cfg.out, run.model.state_dict(), run.opt.state_dict(), step + 1, {"skipped": run.skipped})
            stop_hooks(step)
    check_skipped(cfg, run.skipped, run.total)
    if not val and run.val_idx:  # resumed at its last step: validate the weights it ends with
        val = evaluate(run, run.total)
    return {**val, "skipped": run.skipped}
