"""Read feature shards lazily: safetensors slices are memory-mapped, so a
dataset larger than RAM trains without being loaded."""

from __future__ import annotations

import bisect
from pathlib import Path

import torch
from safetensors import safe_open

from eaglewire.data.manifest import MANIFEST, Manifest, refuse_unservable_order, verify_shards
from eaglewire.infra.errors import EaglewireError


class FeatureDataset(torch.utils.data.Dataset):
    """Sample i -> {input_ids [T], loss_mask [T], features [T, P, H], target_hidden [T, H]}."""

    def __init__(self, root: Path, verify: bool = True, max_len: int | None = None, check_order: bool = True):
        self.root = Path(root)
        self.manifest = Manifest.load(self.root)
        if check_order:  # before training on it, not at export; the doctors read any order to diagnose it
            refuse_unservable_order(self.manifest.points, str(self.root / MANIFEST))
        if not self.manifest.complete:
            raise EaglewireError(f"{self.root}: extraction did not finish (run `eaglewire data extract --resume`)")
        if verify:
            verify_shards(self.root, self.manifest)
        self.max_len = max_len
        self._starts, self._offsets = [], []
        n = 0
        for s in self.manifest.shards:
            self._starts.append(n)
            n += s["num_samples"]
        self._len = n
        self._handles: dict[int, object] = {}

    def __len__(self) -> int:
        return self._len

    def _shard(self, k: int):
        h = self._handles.get(k)
        if h is None:
            path = self.root / self.manifest.shards[k]["file"]
            h = safe_open(str(path), framework="pt")
            self._handles[k] = (h, h.get_tensor("offsets"))
        return self._handles[k]

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self._len:
            raise IndexError(i)
        k = bisect.bisect_right(self._starts, i) - 1
        h, offs = self._shard(k)
        j = i - self._starts[k]
        a, b = int(offs[j]), int(offs[j + 1])
        if self.max_len:
            b = min(b, a + self.max_len)
        return {
            "input_ids": h.get_slice("input_ids")[a:b].long(),
            "loss_mask": h.get_slice("loss_mask")[a:b].bool(),
            "features": h.get_slice("features")[a:b],
            "target_hidden": h.get_slice("target_hidden")[a:b],
        }

    def __getstate__(self):  # DataLoader workers reopen shards themselves
        d = dict(self.__dict__)
        d["_handles"] = {}
        return d


def collate(batch: list[dict], pad_id: int = 0) -> dict:
    """Right-pad to the longest sample; attention_mask marks real tokens."""
    T = max(b["input_ids"].shape[0] for b in batch)
    B = len(batch)
    P, H = batch[0]["features"].shape[1:]
    out = {
        "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
        "loss_mask": torch.zeros((B, T), dtype=torch.bool),
        "attention_mask": torch.zeros((B, T), dtype=torch.bool),
        "features": torch.zeros((B, T, P, H), dtype=batch[0]["features"].dtype),
        "target_hidden": torch.zeros((B, T, H), dtype=batch[0]["target_hidden"].dtype),
    }
    if "target_argmax" in batch[0]:
        out["target_argmax"] = torch.zeros((B, T), dtype=torch.long)
    for j, b in enumerate(batch):
        n = b["input_ids"].shape[0]
        if "target_argmax" in out:
            out["target_argmax"][j, :n] = b["target_argmax"]
        out["input_ids"][j, :n] = b["input_ids"]
        out["loss_mask"][j, :n] = b["loss_mask"]
        out["attention_mask"][j, :n] = True
        out["features"][j, :n] = b["features"]
        out["target_hidden"][j, :n] = b["target_hidden"]
    return out
