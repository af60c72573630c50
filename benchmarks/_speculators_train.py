"""Train a speculators 0.9.0 EAGLE-3 drafter with its own recipe on converted eaglewire data (run by
bench_anchor.py in the speculators venv; never imported by eaglewire).

    python _speculators_train.py DATA VERIFIER OUT --epochs 2 --lr 1e-3 --seq-len 2048 --threads 2 [--flags ...]

DATA (written by bench_anchor.py): rows.json ({input_ids, loss_mask} per sample, training rows first) and
hidden_states/hs_<i>.safetensors (`hidden_states` [T, 4, H]: the three captured layers, then the last layer's
pre-final-norm output; `token_ids` [T]), vocab.safetensors (d2t, t2d: the draft vocabulary both trainers use).
Here they become the `datasets` directory speculators' ArrowDataset reads, and training runs through
speculators' own pieces, as its Trainer runs them (its Trainer itself hard-codes CUDA device 0):
`Eagle3DraftModel.from_training_args`, `create_train_val_loaders` (multipack, shift_batch),
`build_optimizers` (Muon on matrices + AdamW), a linear schedule with its 1 % warmup, `clip_grad_norm_(1.0)`,
the KL loss ("eager": the fused one needs Triton), 3 TTT steps at decay 1.0. After each epoch it validates
on the last rows and keeps the epoch with the lowest validation loss (its `checkpoint_best`), saved in fp32
with `save_pretrained` to OUT/best. OUT/result.json holds the per-epoch losses, steps and seconds.
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file


def dataset_dir(data: Path) -> None:
    from datasets import Dataset

    if (data / "dataset_info.json").is_file():
        return
    rows = json.loads((data / "rows.json").read_text())
    ds = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows], "loss_mask": [r["loss_mask"] for r in rows],
                            "seq_len": [len(r["input_ids"]) for r in rows]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(data))


def build(a, vocab):
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config

    tl = create_transformer_layer_config(verifier_name_or_path=a.verifier, num_layers=1, draft_arch="llama",
                                         hidden_act="silu", sliding_window=2048, full_attention_indices=[])
    d2t, t2d = vocab["d2t"], vocab["t2d"]
    return Eagle3DraftModel.from_training_args(
        verifier_config=tl, t2d=t2d, d2t=d2t, verifier_name_or_path=a.verifier, target_layer_ids=a.layer_ids,
        draft_vocab_size=int(d2t.numel()), ttt_steps=3, norm_before_residual=a.norm_before_residual,
        norm_before_fc=a.norm_before_fc, fc_norm=False, norm_output=a.norm_output, embed_requires_grad=False,
        draft_attn_impl="sdpa")


def loaders(a, hidden_size: int):
    from hs_connectors import FileTransfer
    from speculators.models.eagle3 import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    return create_train_val_loaders(
        data_path=str(a.data), total_seq_len=a.seq_len, hidden_states_dtype=torch.float32,
        transfer=FileTransfer(Path(a.data) / "hidden_states"), vllm_endpoint="", on_missing="raise",
        verifier_name_or_path=a.verifier, request_timeout=None, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=1, hidden_size=hidden_size, num_target_layers=3, num_workers=0,
        prefetch_factor=None, preprocess=shift_batch, train_data_ratio=a.train_ratio, seed=42)


def run_epoch(model, loader, kw, opts=None, scheds=None) -> float:
    losses = []
    for batch in loader:
        batch = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        if opts is None:
            with torch.no_grad():
                _, loss, _ = model(**batch, **kw)
        else:
            _, loss, _ = model(**batch, **kw)
            for o in opts:
                o.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for o in opts:
                o.step()
            for s in scheds:
                s.step()
        losses.append(float(loss))
    return sum(losses) / max(len(losses), 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("verifier")
    ap.add_argument("out", type=Path)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)  # 0.9.0's default (the examples' scripts pass 1e-4)
    ap.add_argument("--optimizer", default="muon")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--train-ratio", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layer-ids", type=int, nargs=3, default=None)
    ap.add_argument("--no-norm-before-fc", dest="norm_before_fc", action="store_false")
    ap.add_argument("--no-norm-output", dest="norm_output", action="store_false")
    ap.add_argument("--no-norm-before-residual", dest="norm_before_residual", action="store_false")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    from speculators.losses import resolve_loss_config
    from speculators.train.optimizers import build_optimizers
    from speculators.train.trainer import TrainerConfig, _resolve_scheduler_steps
    from transformers import get_linear_schedule_with_warmup

    dataset_dir(a.data)
    model = build(a, load_file(str(a.data / "vocab.safetensors")))
    train_loader, val_loader = loaders(a, model.hidden_size if hasattr(model, "hidden_size") else
                                       model.config.transformer_layer_config.hidden_size)
    tc = TrainerConfig(lr=a.lr, muon_lr=a.lr, num_epochs=a.epochs, save_path=str(a.out), optimizer=a.optimizer,
                       weight_decay=0.01, scheduler_type="linear")
    opts = build_optimizers(model, tc)
    warm, total = _resolve_scheduler_steps(tc, len(train_loader))
    scheds = [get_linear_schedule_with_warmup(o, num_warmup_steps=warm, num_training_steps=total) for o in opts]
    kw = dict(ttt_steps=3, ttt_step_loss_decay=1.0, loss_config=resolve_loss_config("kl_div", "eager"))
    res = {"steps_per_epoch": len(train_loader), "warmup": warm, "total_steps": total, "epochs": []}
    best, t0 = None, time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        tr = run_epoch(model, train_loader, kw, opts, scheds)
        model.eval()
        val = run_epoch(model, val_loader, kw)
        res["epochs"].append({"epoch": epoch, "train_loss": tr, "val_loss": val,
                              "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(res["epochs"][-1]), flush=True)
        if best is None or val < best:
            best = val
            tmp = a.out / "best.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(str(tmp))  # fp32: the CPU run trained in fp32
            shutil.rmtree(a.out / "best", ignore_errors=True)
            tmp.rename(a.out / "best")
            res["best_epoch"] = epoch
    res["seconds"] = round(time.perf_counter() - t0, 1)
    (a.out / "result.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
