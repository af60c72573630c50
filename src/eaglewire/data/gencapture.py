"""Capture the target's features while it generates the answers, instead of a second forward.

WHY: a dataset built in process ran the target twice over every token: once
to generate the answer, once more (extraction) to capture the hidden states
at the points. The generation forwards already compute those states: on the
standard preset extraction was 9.4 of the data stage's 37 minutes. Here
forward hooks keep the points (and `final_norm`) of every generation step;
what generation never fed (the last answer token of the longest rows, the
template's end of turn) costs one more cached forward of a few tokens per
batch; the result is written per batch into `<dataset>/gencapture/` and
extraction reads it instead of running the target (``GenCaptured``).

Exactness: the features are those of the same fp32 forward with a KV cache
and left padding, equal to extraction's right-padded forward to float
rounding (tested against it). Every stored row carries the token ids it was
computed for, and extraction uses it only when those ids equal the sample it
builds (``data/answers.py``), from the same target (fingerprint), points and
storage dtype; anything else (a row regenerated after a kill, a changed
template) takes the ordinary forward. The folder is a cache: extraction
removes it once the dataset is complete.

Not used for targets with sliding-window layers (their window is applied by
cache positions, which the completion forward does not keep contiguous), on
a serving engine (`--server`, `--engine vllm`) or under torchrun: those keep
the second forward.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglewire.data.answers import sample_ids
from eaglewire.infra.atomic import follow_umask, on_disk_full
from eaglewire.infra.device import dtype_from_name
from eaglewire.targets.capture import capturing, decoder_stack
from eaglewire.targets.chat import assistant_end_ids
from eaglewire.targets.families import batch_sensitive
from eaglewire.targets.fingerprint import TargetFingerprint
from eaglewire.targets.points import FINAL_NORM, Point

GENCAPTURE = "gencapture"


def why_not(config) -> str | None:
    """Why features cannot be captured during generation for this model config (None: they can)."""
    if sensitive := batch_sensitive(config):
        return sensitive
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in types or (window and not types and getattr(config, "use_sliding_window", True)):
        return "the target has sliding-window layers"
    return None


def _fingerprint(target) -> str:
    return json.dumps(TargetFingerprint.of(target).__dict__, sort_keys=True, default=str)


class Recording:
    """What one `generate` call left: the padded prompts, the cache, and the points' outputs per forward."""

    def __init__(self):
        self.ids = self.mask = self.cache = None
        self.n_new = 0  # columns generate added (= its forwards: the prefill and n_new - 1 steps)
        self.steps: dict[str, list[torch.Tensor]] = {}


class GenCapture:
    """Hooks for batched generation and the per-batch files extraction reads (`<dataset>/gencapture/`)."""

    def __init__(self, target, out_dir: Path, points: list[Point], store_dtype: str):
        self.target, self.dir = target, Path(out_dir) / GENCAPTURE
        self.points = list(points)
        self.want = self.points + ([FINAL_NORM] if FINAL_NORM not in self.points else [])
        self.store_dtype = store_dtype
        self.sdtype = dtype_from_name(store_dtype, "--store-dtype")
        self.stop = assistant_end_ids(target.tokenizer)
        self.fingerprint = _fingerprint(target)  # hashes the embedding: once, not per batch
        self.rows_written = 0

    @contextmanager
    def recording(self, model, rec: Recording):
        """Every forward inside appends each point's output [B, T, H] to `rec.steps`."""
        with capturing(model, self.want, history=True) as steps:
            rec.steps = steps
            yield rec

    @torch.no_grad()
    def complete(self, rec: Recording, rows: list[dict | None]) -> list[tuple | None]:
        """Per batch row ({index, messages, answer_ids}, or None for a row not written): (index, sample
        ids, [n, P, H] features, [n, H] final norm), or None when the row is left to extraction's forward."""
        B, T = rec.ids.shape
        S = rec.n_new
        got = {k: torch.cat(v, dim=1) for k, v in rec.steps.items()}  # [B, T+S-1, H] each
        if not rows or any(g.shape[1] != T + S - 1 for g in got.values()):
            return [None] * len(rows)
        plan = []
        for b, row in enumerate(rows):
            if row is None:
                plan.append(None)
                continue
            plen = int(rec.mask[b].sum())
            pad = T - plen
            seq, _ = sample_ids(self.target.tokenizer, row, self.stop)
            ans = list(row["answer_ids"])
            ok = seq[:plen] == rec.ids[b, pad:].tolist() and seq[plen:plen + len(ans)] == ans
            have = plen + min(len(ans), S - 1)  # positions whose features generation computed
            plan.append((pad, have, seq) if ok else None)
        tails = self._tails(rec, plan, T + S - 1)
        res = []
        for b, (row, p) in enumerate(zip(rows, plan)):
            if p is None:  # also every row not written
                res.append(None)
                continue
            pad, have, seq = p
            per = {k: torch.cat([got[k][b, pad:pad + have], tails[k][b, :len(seq) - have]]) if k in tails
                   else got[k][b, pad:pad + have] for k in got}
            feats = torch.stack([per[q.name] for q in self.points], dim=1)  # [n, P, H]
            res.append((row["index"], seq, feats, per[FINAL_NORM.name]))  # [n, H]
        return res

    def _tails(self, rec: Recording, plan: list, cached: int) -> dict[str, torch.Tensor]:
        """The points at what generation never fed, in one cached forward of a few tokens per row."""
        B = rec.ids.shape[0]
        miss = [p[2][p[1]:] if p else [] for p in plan]
        M = max(len(m) for m in miss)
        if M == 0:
            return {}
        dev = rec.ids.device
        pad_id = self.target.tokenizer.pad_token_id or 0
        new = torch.full((B, M), pad_id, dtype=torch.long, device=dev)  # [B, M]
        pos = torch.zeros((B, M), dtype=torch.long, device=dev)  # [B, M]
        att = torch.zeros((B, cached + M), dtype=torch.long, device=dev)  # [B, cached + M]
        for b, (p, m) in enumerate(zip(plan, miss)):
            if p is None:
                att[b, cached] = 1  # a row nobody reads still needs one key
                continue
            pad, have, _ = p
            new[b, :len(m)] = torch.tensor(m, dtype=torch.long)
            pos[b] = torch.arange(have, have + M)
            att[b, pad:pad + have] = 1  # the prompt and the fed answer; not the padding after an early EOS
            att[b, cached:cached + max(len(m), 1)] = 1
        with capturing(self.target.model, self.want) as store:
            decoder_stack(self.target.model)(input_ids=new, attention_mask=att, position_ids=pos,
                                             cache=rec.cache, use_cache=True)
        return {k: v for k, v in store.items()}  # [B, M, H]

    def write(self, part: list[tuple]) -> None:
        """One file per generation batch, written under a temporary name and renamed."""
        part = [r for r in part if r is not None]
        if not part:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        lens = torch.tensor([len(r[1]) for r in part])
        tensors = {
            "index": torch.tensor([r[0] for r in part], dtype=torch.long),  # [n]
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),  # [n+1]
            "input_ids": torch.tensor([t for r in part for t in r[1]], dtype=torch.int32),  # [N]
            "features": torch.cat([r[2] for r in part]).to(self.sdtype).cpu().contiguous(),  # [N, P, H]
            "target_hidden": torch.cat([r[3] for r in part]).to(self.sdtype).cpu().contiguous(),  # [N, H]
        }
        meta = {"points": json.dumps([p.name for p in self.points]), "store_dtype": self.store_dtype,
                "target": self.fingerprint}
        k = 1 + max((int(p.stem[5:]) for p in self.dir.glob("part-*.safetensors")), default=-1)
        tmp = self.dir / f".part-{k:05d}.tmp"
        try:  # a full disk: one line; the answers written so far stay, the part never appears half-written
            with on_disk_full(self.dir, f"part-{k:05d}.safetensors (features kept while generating)"):
                save_file(tensors, str(tmp), metadata=meta)
            follow_umask(tmp)
            os.replace(tmp, self.dir / f"part-{k:05d}.safetensors")
        finally:
            tmp.unlink(missing_ok=True)
        self.rows_written += len(part)


class GenCaptured:
    """Extraction's capture from `<dataset>/gencapture/`: stored rows whose ids match, the forward for the rest."""

    def __init__(self, inner, out_dir: Path, target, points: list[Point], store_dtype: str):
        self.inner, self.forward_dtype = inner, inner.forward_dtype
        self.entries: dict[int, tuple[Path, int, int]] = {}
        self.used = 0
        d = Path(out_dir) / GENCAPTURE
        want = {"points": json.dumps([p.name for p in points]), "store_dtype": store_dtype,
                "target": _fingerprint(target)}
        for f in sorted(d.glob("part-*.safetensors")):
            with safe_open(str(f), framework="pt") as h:
                if {k: (h.metadata() or {}).get(k) for k in want} != want:
                    continue  # another target, other points or dtype: its rows are not ours to use
                off = h.get_tensor("offsets").tolist()
                for j, idx in enumerate(h.get_tensor("index").tolist()):
                    self.entries[idx] = (f, off[j], off[j + 1])  # a later part wins (a regenerated row)
        self._open: dict[Path, object] = {}

    def provenance(self) -> dict:
        return {**self.inner.provenance(), "during_generation": len(self.entries)}

    def _read(self, idx: int, ids: list[int]):
        f, a, b = self.entries[idx]
        h = self._open.get(f) or self._open.setdefault(f, safe_open(str(f), framework="pt"))
        n = len(ids)
        if n > b - a or h.get_slice("input_ids")[a:a + n].tolist() != ids:
            return None
        return h.get_slice("features")[a:a + n].float(), h.get_slice("target_hidden")[a:a + n].float()

    def __call__(self, batch: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        got = [self._read(it[0], it[1]) if it[0] in self.entries else None for it in batch]
        misses = [it for it, g in zip(batch, got) if g is None]
        rest = iter(self.inner(misses) if misses else [])
        self.used += len(batch) - len(misses)
        return [g if g is not None else next(rest) for g in got]


def remove(out_dir: Path) -> None:
    """Drop the folder once the dataset's shards hold everything (it is a cache, as large as they are)."""
    shutil.rmtree(Path(out_dir) / GENCAPTURE, ignore_errors=True)
