"""Capture target features for (prompt, target answer) conversations into shards.

One forward per batch (right padding, so positions are exactly those of batch
1) captures the configured points plus `final_norm`, from which training
recomputes the target's distribution with the frozen lm_head. Shards are
written under a temporary name and renamed, and the manifest is rewritten
after each one, so a killed run resumed with `--resume` neither loses nor
duplicates a sample.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from eaglewire.data.answers import answer_tokens, sample_ids
from eaglewire.data.config import ExtractSettings
from eaglewire.data.gencapture import GENCAPTURE, GenCaptured
from eaglewire.data.gencapture import remove as remove_gencapture
from eaglewire.data.manifest import MANIFEST, Manifest, shard_problem
from eaglewire.infra.atomic import follow_umask, on_disk_full
from eaglewire.infra.checksums import file_sha256
from eaglewire.infra.device import dtype_from_name, dtype_name
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.capture import capture
from eaglewire.targets.chat import assistant_end_ids
from eaglewire.targets.families import batch_sensitive
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord, chat_template_hash
from eaglewire.targets.points import FINAL_NORM, Point, parse_points

_SHARD_DELAY = float(os.environ.get("EAGLEWIRE_SHARD_DELAY", "0"))


def tokenize_rows(tokenizer, rows: list[dict], max_len: int) -> tuple[list, dict]:
    """(index, input_ids, loss_mask) per usable row, and counts of what was dropped.

    A row's answer is the ids the target generated when it stores them (data/answers.py), else its text.
    """
    out, counts = [], {"truncated": 0, "no_loss_tokens": 0}
    stop = assistant_end_ids(tokenizer)
    for r in rows:
        ids, mask = sample_ids(tokenizer, r, stop)
        if len(ids) > max_len:
            ids, mask = ids[:max_len], mask[:max_len]
            counts["truncated"] += 1
        if sum(mask) == 0:
            counts["no_loss_tokens"] += 1
            continue
        out.append((r["index"], ids, mask))
    return out, counts


def _batches(items: list, batch_tokens: int):
    cur, longest = [], 0
    for it in items:
        n = len(it[1])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            yield cur
            cur, longest = [], 0
        cur.append(it)
        longest = max(longest, n)
    if cur:
        yield cur


class _NormStats:
    """Per-slot token-norm statistics, so `data info` and the doctor can spot a wrong slot."""

    def __init__(self, names, restored: list[dict] | None = None):
        self.names = names
        self.sum = [r["sum_norm"] for r in restored] if restored else [0.0] * len(names)
        self.max = [r["max_norm"] for r in restored] if restored else [0.0] * len(names)
        self.n = restored[0]["num_tokens"] if restored else 0

    def add(self, feats: torch.Tensor) -> None:  # [N, P, H]
        norms = feats.float().norm(dim=-1)  # [N, P]
        self.n += norms.shape[0]
        for j in range(len(self.names)):
            self.sum[j] += float(norms[:, j].sum())
            self.max[j] = max(self.max[j], float(norms[:, j].max()))

    def as_list(self) -> list[dict]:
        return [{"slot": j, "point": n, "mean_norm": self.sum[j] / max(self.n, 1), "max_norm": self.max[j],
                 "sum_norm": self.sum[j], "num_tokens": self.n} for j, n in enumerate(self.names)]


def new_manifest(target, pts: list[Point], s: ExtractSettings, gen: dict) -> Manifest:
    """The manifest of a dataset captured in process from `target` (also what online training records)."""
    return Manifest(
        target=TargetRecord(source=target.source, path=str(target.path), fingerprint=TargetFingerprint.of(target)),
        points=list(pts), num_slots=len(pts), chat_template_sha=chat_template_hash(target.tokenizer),
        generation=gen, extract=dict(s.__dict__), forward_dtype=dtype_name(target.dtype))


def _check_resume(old: Manifest, new: Manifest, out_dir: Path) -> None:
    diffs = [("target", old.target.fingerprint.describe_mismatch(new.target.fingerprint)),
             ("capture points", old.points != new.points and f"stored {old.point_names}, requested {new.point_names}"),
             ("chat template", old.chat_template_sha != new.chat_template_sha
              and f"stored {old.chat_template_sha}, requested {new.chat_template_sha}"),
             ("extraction settings", old.extract != new.extract and f"stored {old.extract}, requested {new.extract}"),
             ("capture engine", old.capture_engine != new.capture_engine
              and f"stored by {old.capture_engine}, requested {new.capture_engine}")]
    for what, diff in diffs:
        if diff:
            raise EaglewireError(f"{out_dir}: --resume with a different {what} than the dataset there "
                                 f"({diff}); use a new --out directory")


def write_shard(out_dir: Path, k: int, buf: list, sdtype) -> dict:
    ids = torch.cat([torch.tensor(b[1], dtype=torch.int32) for b in buf])
    lens = torch.tensor([len(b[1]) for b in buf])
    tensors = {
        "input_ids": ids,  # [N]
        "loss_mask": torch.cat([torch.tensor(b[2], dtype=torch.uint8) for b in buf]),  # [N]
        "features": torch.cat([b[3] for b in buf]).to(sdtype).contiguous(),  # [N, P, H]
        "target_hidden": torch.cat([b[4] for b in buf]).to(sdtype).contiguous(),  # [N, H]
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),  # [n+1]
        "sample_index": torch.tensor([b[0] for b in buf], dtype=torch.long),  # [n]
    }
    name = f"shard-{k:05d}.safetensors"
    tmp = out_dir / f".{name}.tmp"
    try:
        with on_disk_full(out_dir, name):
            save_file(tensors, str(tmp))
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves no torn temporary
        raise
    follow_umask(tmp)  # safetensors writes 0600; a reader running as another user needs the umask's modes
    tmp.replace(out_dir / name)
    return {"file": name, "num_samples": len(buf), "num_tokens": int(ids.numel()),
            "num_loss_tokens": int(tensors["loss_mask"].sum()), "indices": [b[0] for b in buf],
            "bytes": (out_dir / name).stat().st_size, "sha256": file_sha256(out_dir / name)}


def _drop_bad_shards(out_dir: Path, man: Manifest) -> list[str]:
    """Remove missing/corrupt shards from the manifest (their samples get re-extracted); recount the rest."""
    bad = [(e, why) for e in man.shards if (why := shard_problem(out_dir, e))]
    if not bad:
        return []
    for e, _ in bad:
        (out_dir / e["file"]).unlink(missing_ok=True)
    man.shards = [e for e in man.shards if e not in [b[0] for b in bad]]
    man.recount()
    stats = _NormStats(man.point_names)
    for e in man.shards:  # norm statistics over the intact shards only
        with safe_open(str(out_dir / e["file"]), framework="pt") as f:
            stats.add(f.get_tensor("features"))
    man.norm_stats = stats.as_list()
    man.complete = False
    man.save(out_dir)
    return [f"{e['file']} ({why})" for e, why in bad]


def _unlisted_shards(out_dir: Path, old: Manifest | None) -> list[Path]:
    """Shard files the manifest does not list: the one it says was being written (ours, redone), else refused.

    Anything else named like a shard was not written by this dataset's runs;
    deleting it on a resume would lose someone's file, so the run stops first.
    """
    listed = {s["file"] for s in old.shards} if old else set()
    pending = old.pending if old else None
    found = sorted(p for p in out_dir.glob("shard-*.safetensors") if p.name not in listed)
    foreign = [p.name for p in found if p.name != pending]
    if foreign:
        raise EaglewireError(f"{out_dir}: holds {', '.join(foreign[:3])}, which {MANIFEST if old else 'no manifest'} "
                             "lists (not written by this dataset's runs); move it away or choose another directory")
    return found


def refuse_foreign_shards(out_dir: Path) -> None:
    """Stop before any work when `out_dir` holds shard files its manifest does not account for."""
    if Path(out_dir).is_dir():
        _unlisted_shards(Path(out_dir), Manifest.load(out_dir) if Manifest.exists(out_dir) else None)


def _prepare_out(out_dir: Path, man: Manifest, resume: bool) -> set[int]:
    out_dir.mkdir(parents=True, exist_ok=True)
    old = None
    if Manifest.exists(out_dir):
        if not resume:
            raise EaglewireError(f"{out_dir}: already holds a dataset; pass --resume to continue it or choose a new --out")
        old = Manifest.load(out_dir)
    redone = _unlisted_shards(out_dir, old)  # refused before anything is touched
    if old is not None:
        _check_resume(old, man, out_dir)
        man.shards, man.norm_stats = old.shards, old.norm_stats
        man.recount()
        if old.forward_dtype != man.forward_dtype:  # shards from two precisions: let the doctor infer
            man.forward_dtype = None
        redo = _drop_bad_shards(out_dir, man)
        if redo:
            print(f"[extract] re-extracting the samples of {len(redo)} bad shard(s): {', '.join(redo)}", flush=True)
    for p in redone:  # written after the last manifest update: redo it
        p.unlink()
    for p in out_dir.glob(".shard-*.tmp"):
        p.unlink()
    return set(man.sample_indices())


class InProcessCapture:
    """The target's forward in this process (transformers), hooked at the points: the reference capture."""

    def __init__(self, target, pts: list[Point]):
        self.target, self.pts = target, pts
        self.forward_dtype = dtype_name(target.dtype)

    def provenance(self) -> dict:
        return {"engine": "transformers", "version": transformers.__version__}

    def __call__(self, batch: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return forward_features(self.target, batch, self.pts)


def extract(target, rows: list[dict], out_dir: Path, s: ExtractSettings, gen: dict, resume: bool = False,
            after_shard=None, capture_with=None) -> Manifest:
    """Capture features for `rows` ({index, messages}) into `out_dir`; returns the manifest.

    `capture_with(batch)` computes ([n, P, H] features, [n, H] final norm) per sample; by
    default the target's forward here (reading what generation kept in `out_dir/gencapture/` first,
    data/gencapture.py), or a serving engine (data/extract_vllm.py).
    """
    pts = parse_points(s.points, target.num_layers)
    sdtype = dtype_from_name(s.dtype, "--store-dtype")
    cap = capture_with or InProcessCapture(target, pts)
    if capture_with is None and (out_dir / GENCAPTURE).is_dir():
        cap = GenCaptured(cap, out_dir, target, pts, s.dtype)
    man = new_manifest(target, pts, s, gen)
    man.forward_dtype, man.capture = cap.forward_dtype, cap.provenance()
    done = _prepare_out(out_dir, man, resume)
    items, counts = tokenize_rows(target.tokenizer, [r for r in rows if r["index"] not in done], s.max_seq_len)
    man.dropped, man.answer_tokens = counts, answer_tokens(rows)
    stats = _NormStats([p.name for p in pts], man.norm_stats)
    buf, t0, ntok = [], time.perf_counter(), 0
    total = sum(len(i[1]) for i in items)
    # closed on an error too, so the one `error:` line starts a line of its own
    with tqdm(total=total, desc="extract", unit="tok", unit_scale=True, dynamic_ncols=True) as bar:
        for batch in _batches(items, s.batch_tokens):
            feats = cap(batch)
            for (idx, ids, mask), (f, h) in zip(batch, feats):
                buf.append((idx, ids, mask, f, h))
            ntok += sum(len(b[1]) for b in batch)
            bar.update(sum(len(b[1]) for b in batch))
            while len(buf) >= s.shard_samples:
                _flush(out_dir, man, buf[: s.shard_samples], sdtype, stats)
                buf = buf[s.shard_samples:]
                if after_shard:
                    after_shard(man)
                if _SHARD_DELAY:  # lets crash tests kill a real run between shards
                    time.sleep(_SHARD_DELAY)
        if buf:
            _flush(out_dir, man, buf, sdtype, stats)
    stored = man.sample_indices()
    want = done | {it[0] for it in items}
    if len(stored) != len(set(stored)) or set(stored) != want:
        raise EaglewireError(f"{out_dir}: the shards hold {len(set(stored))} distinct samples ({len(stored)} entries) "
                             f"where {len(want)} were expected; the manifest is left incomplete (run with --resume)")
    man.complete = True
    man.extract_tokens_per_s = ntok / max(time.perf_counter() - t0, 1e-9)
    man.save(out_dir)
    remove_gencapture(out_dir)  # the shards hold everything now
    return man


@torch.no_grad()
def forward_features(target, batch: list, pts: list[Point]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Right-padded forward; per sample ([n, P, H] features, [n, H] final-norm hidden) on CPU. A target whose
    states depend on the batch (`families.batch_sensitive`: DeepSeek-V3.2's indexer) runs each sample alone."""
    if len(batch) > 1 and batch_sensitive(target.config):
        return [r for b in batch for r in forward_features(target, [b], pts)]
    want = pts + ([FINAL_NORM] if FINAL_NORM not in pts else [])
    T = max(len(b[1]) for b in batch)
    pad = target.tokenizer.pad_token_id
    ids = torch.full((len(batch), T), pad, dtype=torch.long)
    att = torch.zeros((len(batch), T), dtype=torch.long)
    for j, (_, seq, _) in enumerate(batch):
        ids[j, : len(seq)] = torch.tensor(seq)
        att[j, : len(seq)] = 1
    got = capture(target.model, ids.to(target.device), want, attention_mask=att.to(target.device))
    slots = torch.stack([got[p.name] for p in pts], dim=2)  # [B, T, P, H]
    fin = got[FINAL_NORM.name]  # [B, T, H]
    return [(slots[j, : len(b[1])].cpu(), fin[j, : len(b[1])].cpu()) for j, b in enumerate(batch)]


def _flush(out_dir: Path, man: Manifest, buf: list, sdtype, stats: _NormStats) -> None:
    for b in buf:  # only what is on disk counts, so a resumed run never counts a sample twice
        stats.add(b[3])
    # the next free number: after a bad shard was dropped, len(shards) may name an existing file
    k = 1 + max((int(e["file"][6:11]) for e in man.shards), default=-1)
    man.pending = f"shard-{k:05d}.safetensors"  # recorded first: a resume after a kill removes only this file
    man.save(out_dir)
    man.add_shard(write_shard(out_dir, k, buf, sdtype))
    man.pending = None
    man.norm_stats = stats.as_list()
    man.save(out_dir)
