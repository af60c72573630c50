"""The drafter's reduced output vocabulary (EAGLE-3 ``d2t`` / ``t2d``).

The drafter predicts over the N target tokens that appear most often in the
loss-masked (assistant) training tokens, which is where its predictions are
scored. Conventions, shared with EAGLE-3 checkpoints:

* ``d2t`` holds OFFSETS: ``target_id = draft_id + d2t[draft_id]``.
* ``t2d`` is a bool mask over the target vocabulary, True for selected ids.
* Selected ids are sorted ascending by target id (so ``d2t`` is non-decreasing).

Selection: highest count first, ties broken by the lower token id. Padding
rule: when fewer than N distinct tokens have a count > 0, the remaining slots
take the lowest target ids not yet selected (they have count 0; this keeps
the vocabulary size fixed, which the drafter's lm_head shape depends on).
When ``draft_size >= V`` the draft vocabulary is the identity (size V,
``d2t`` all zero).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglewire.drafter.vocabmap import duplicate_target
from eaglewire.infra.atomic import atomic_file, follow_umask, on_disk_full, read_json
from eaglewire.infra.errors import EaglewireError

TENSORS_FILE = "vocab.safetensors"
META_FILE = "vocab.json"


@dataclass
class DraftVocab:
    """Selected target ids (ascending) with their EAGLE-3 mappings and statistics."""

    d2t: torch.Tensor  # int64 [N], offsets
    t2d: torch.Tensor  # bool [V]
    coverage: float  # share of counted tokens whose id is in the draft vocab
    selected: torch.Tensor  # int64 [N], target ids, ascending
    counts: torch.Tensor  # int64 [V], the counts the selection was made from

    @property
    def size(self) -> int:
        return int(self.d2t.numel())

    @property
    def vocab_size(self) -> int:
        return int(self.t2d.numel())


def count_tokens(input_ids_list, loss_mask_list, vocab_size: int) -> torch.Tensor:
    """Per-token counts over loss-masked positions only (what the drafter is scored on)."""
    if len(input_ids_list) != len(loss_mask_list):
        raise EaglewireError(
            f"count_tokens: {len(input_ids_list)} id sequences but {len(loss_mask_list)} loss masks (expected equal)"
        )
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for n, (ids, mask) in enumerate(zip(input_ids_list, loss_mask_list, strict=True)):
        ids_t = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        mask_t = torch.as_tensor(mask).reshape(-1).bool()
        if ids_t.numel() != mask_t.numel():
            raise EaglewireError(
                f"count_tokens: sample {n} has {ids_t.numel()} ids but {mask_t.numel()} mask entries (expected equal)"
            )
        sel = ids_t[mask_t]
        if sel.numel() and (int(sel.min()) < 0 or int(sel.max()) >= vocab_size):
            raise EaglewireError(f"count_tokens: sample {n} has a token id outside [0, {vocab_size})")
        counts += torch.bincount(sel, minlength=vocab_size)
    return counts


def _from_selected(selected: torch.Tensor, counts: torch.Tensor) -> DraftVocab:
    """Build the mappings from ascending target ids."""
    v = counts.numel()
    d2t = selected - torch.arange(selected.numel(), dtype=torch.int64)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[selected] = True
    total = int(counts.sum())
    coverage = float(counts[selected].sum()) / total if total else 0.0
    return DraftVocab(d2t=d2t, t2d=t2d, coverage=coverage, selected=selected, counts=counts)


def build_draft_vocab(token_counts: torch.Tensor, draft_size: int) -> DraftVocab:
    """Top-`draft_size` tokens by count (ties: lower id), sorted ascending; see module docstring."""
    counts = torch.as_tensor(token_counts)
    if counts.dim() != 1 or counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise EaglewireError(f"build_draft_vocab: token_counts must be a 1-D integer tensor, got {tuple(counts.shape)} {counts.dtype}")
    counts = counts.to(torch.int64)
    if bool((counts < 0).any()):
        raise EaglewireError("build_draft_vocab: token_counts has negative entries (expected counts >= 0)")
    if draft_size < 1:
        raise EaglewireError(f"build_draft_vocab: draft_size={draft_size} (expected >= 1)")
    v = counts.numel()
    if draft_size >= v:
        return _from_selected(torch.arange(v, dtype=torch.int64), counts)
    # stable sort on ascending ids => equal counts keep the lower id first; zero-count
    # ids come last in id order, which is exactly the padding rule.
    order = torch.sort(-counts, stable=True).indices
    selected = torch.sort(order[:draft_size]).values
    return _from_selected(selected, counts)


def save_vocab(path_dir, vocab: DraftVocab) -> Path:
    """Write ``vocab.safetensors`` (d2t, t2d, counts) and ``vocab.json`` (summary)."""
    d = Path(path_dir)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous(), "counts": vocab.counts.contiguous()}
    meta = {
        "size": vocab.size,
        "vocab_size": vocab.vocab_size,
        "coverage": vocab.coverage,
        "num_counted_tokens": int(vocab.counts.sum()),
        "num_distinct": int((vocab.counts > 0).sum()),
    }
    # Both files are written aside first and only then renamed (renames need no space): a full disk leaves
    # the previous pair whole, never new tensors beside an old summary.
    tmp = d / f".{TENSORS_FILE}.tmp"
    try:
        with on_disk_full(d, TENSORS_FILE):
            save_file(tensors, str(tmp))
        follow_umask(tmp)
        with atomic_file(d / META_FILE) as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
            tmp.replace(d / TENSORS_FILE)
    finally:
        tmp.unlink(missing_ok=True)
    return d


def _check_loaded(path: Path, d2t: torch.Tensor, t2d: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Validate shapes and the d2t/t2d agreement; return the selected target ids."""
    if d2t.dim() != 1 or d2t.dtype != torch.int64 or t2d.dim() != 1 or t2d.dtype != torch.bool:
        raise EaglewireError(f"{path}: expected d2t int64 [N] and t2d bool [V], got {d2t.dtype} {tuple(d2t.shape)} "
                             f"and {t2d.dtype} {tuple(t2d.shape)}")
    v = t2d.numel()
    if counts.shape != (v,):
        raise EaglewireError(f"{path}: counts has shape {tuple(counts.shape)} (expected ({v},), like t2d)")
    selected = d2t + torch.arange(d2t.numel(), dtype=torch.int64)
    if selected.numel() and (int(selected.min()) < 0 or int(selected.max()) >= v):
        raise EaglewireError(f"{path}: d2t maps draft ids outside the target vocabulary [0, {v})")
    if (dup := duplicate_target(d2t)) is not None:
        raise EaglewireError(f"{path}: d2t maps two draft ids to target id {dup} (expected each target id once)")
    if selected.numel() > 1 and not bool((selected[1:] > selected[:-1]).all()):
        raise EaglewireError(f"{path}: d2t does not map to strictly ascending target ids (expected sorted, unique)")
    if int(t2d.sum()) != selected.numel() or not bool(t2d[selected].all()):
        raise EaglewireError(f"{path}: d2t and t2d disagree (expected t2d True exactly at target = draft + d2t[draft])")
    return selected


def load_vocab(path_dir) -> DraftVocab:
    """Load and validate a vocabulary written by :func:`save_vocab`."""
    d = Path(path_dir)
    path, meta_path = d / TENSORS_FILE, d / META_FILE
    for p in (path, meta_path):
        if not p.is_file():
            raise EaglewireError(f"{p}: missing: build the draft vocabulary with `eaglewire data vocab {d}`")
    try:
        t = load_file(str(path))
    except Exception as e:  # noqa: BLE001  a damaged safetensors file fails inside the reader
        raise EaglewireError(f"{path}: cannot read the draft vocabulary ({type(e).__name__}: {e})") from e
    meta = read_json(meta_path, f"no {META_FILE}")
    if not isinstance(meta, dict):
        raise EaglewireError(f"{meta_path}: expected a JSON object with the vocabulary's size")
    missing = [k for k in ("d2t", "t2d", "counts") if k not in t]
    if missing:
        raise EaglewireError(f"{path}: missing tensors {missing} (expected d2t, t2d, counts)")
    selected = _check_loaded(path, t["d2t"], t["t2d"], t["counts"])
    if meta.get("size") != selected.numel():
        raise EaglewireError(f"{meta_path}: size={meta.get('size')} but {path} has {selected.numel()} draft tokens")
    vocab = _from_selected(selected, t["counts"].to(torch.int64))
    return vocab
