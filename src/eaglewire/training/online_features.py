"""Online training: the target runs inside the training loop and no feature is stored.

Why: features cost P*H*2 bytes per token (tens of KB per token on a 4k-wide
target, terabytes for a real dataset), while the target's forward is cheap
next to a TTT step on a GPU. `train --online` reads only `responses.jsonl`.

Exactness: a sample here is exactly what `FeatureDataset` yields for the same
response after `eaglewire data extract`: the same rows, tokens (the target's
stored answer ids, or the text of an older dataset: data/answers.py), loss mask
and drop rule (`extract.tokenize_rows`), the same hooks and right-padded
forward (`extract.forward_features`), and the same rounding of the features to the
store dtype, so offline and online training follow the same losses (tested;
only the padding of the batch the target ran in differs, a last-bit effect).
With `--engine vllm` (online_vllm.py) the same samples are captured by a vLLM
server instead of this process's forward: `OnlineDataset` takes that capture.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from eaglewire.data.answers import answer_tokens, check_answer_vocab
from eaglewire.data.config import RESPONSES, ExtractSettings
from eaglewire.data.extract import forward_features, new_manifest, tokenize_rows
from eaglewire.data.jsonl import read_jsonl, response_problem
from eaglewire.data.pipeline import auto_vocab_size
from eaglewire.data.recorded import GENERATE_CONFIG, recorded_generate
from eaglewire.data.vocab import TENSORS_FILE, build_draft_vocab, count_tokens, load_vocab
from eaglewire.infra.checksums import file_sha256
from eaglewire.infra.device import dtype_from_name, resolve_dtype
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.load import load_target, resolve_target_dir
from eaglewire.targets.points import Point, point_option
from eaglewire.training.inputs import TrainInputs


def read_responses(data: Path) -> list[dict]:
    """The rows extraction would read, or one line naming the missing/empty file."""
    path = Path(data) / RESPONSES
    if not path.is_file():
        raise EaglewireError(f"{path}: missing (--online trains on the answers `eaglewire data generate` writes there)")
    rows = [r for r in read_jsonl(path, tolerate_partial_tail=False, check=response_problem) if "messages" in r]
    if not rows:
        raise EaglewireError(f"{path}: no responses (run `eaglewire data generate` first)")
    return rows


def online_points(points: list[str], num_layers: int, default_points=None) -> list[Point]:
    """--points, or with none the EAGLE-3 triple, or `default_points(num_layers)` (DFlash: z-lab's ids)."""
    return point_option(points, num_layers, default=default_points is None) or default_points(num_layers)


class OnlineDataset(torch.utils.data.Dataset):
    """Sample i -> FeatureDataset's dict for the i-th usable response, features computed on demand.

    `get_batch` runs one target forward for a whole micro-batch (or asks
    `capture`, a serving engine's: data/extract_vllm.py); `manifest` is the
    manifest extraction would write for these rows (points in every engine's
    ids, target fingerprint, chat template hash, the capture's provenance),
    marked `online`.
    """

    def __init__(self, root: Path, rows: list[dict], target, points: list[str], store_dtype: str,
                 max_len: int | None = None, gen: dict | None = None, compute_dtype: torch.dtype = torch.float32,
                 default_points=None, capture=None):
        self.pts = online_points(points, target.num_layers, default_points)
        # extraction's default truncation and drop rule, unless training reads further than it would store
        seq = max(ExtractSettings.max_seq_len, max_len or 0)
        self.items, dropped = tokenize_rows(target.tokenizer, rows, seq)
        if not self.items:
            raise EaglewireError(f"{Path(root) / RESPONSES}: none of {len(rows)} responses has an assistant token "
                                 "to train on (expected answers from `eaglewire data generate`)")
        # an engine's capture holds the target: the frozen parts here are not kept past the run's setup
        self.target, self.capture = (None if capture else target), capture
        self.max_len, self.compute_dtype = max_len, compute_dtype
        self.sdtype = dtype_from_name(store_dtype, "--store-dtype")
        s = ExtractSettings(points=[p.name for p in self.pts], dtype=store_dtype, max_seq_len=seq)
        self.manifest = new_manifest(target, self.pts, s, gen or {})
        if capture is not None:
            self.manifest.forward_dtype, self.manifest.capture = capture.forward_dtype, capture.provenance()
        self.manifest = dataclasses.replace(
            self.manifest, complete=True, dropped=dropped, num_samples=len(self.items),
            num_tokens=sum(len(it[1]) for it in self.items), num_loss_tokens=sum(sum(it[2]) for it in self.items),
            answer_tokens=answer_tokens(rows), extra={"online": True})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self.items):
            raise IndexError(i)
        return self.get_batch([i])[0]

    def place(self, device: torch.device) -> None:
        """Move the target where its forwards run, in its compute dtype (after the drafter took its fp32 weights);
        an engine's capture runs where the engine is."""
        if self.capture is None:
            self.target.model.to(device=device, dtype=self.compute_dtype)

    def get_batch(self, ids: list[int]) -> list[dict]:
        """Samples `ids`, their features from one right-padded target forward (or the engine's capture), rounded to
        the store dtype."""
        batch = [(idx, seq[:self.max_len], mask[:self.max_len]) for idx, seq, mask in (self.items[i] for i in ids)]
        feats = self.capture(batch) if self.capture is not None else forward_features(self.target, batch, self.pts)
        out = []
        for (_, seq, mask), (f, h) in zip(batch, feats):
            out.append({"input_ids": torch.tensor(seq, dtype=torch.long),  # [T]
                        "loss_mask": torch.tensor(mask, dtype=torch.bool),  # [T]
                        "features": f.to(self.sdtype),  # [T, P, H]
                        "target_hidden": h.to(self.sdtype)})  # [T, H]
        return out


def _vocab(cfg, ds: OnlineDataset, V: int):
    """The dataset's vocab.safetensors when there is one, else the vocab `data vocab` would build from these rows."""
    if (cfg.data / TENSORS_FILE).is_file():
        if cfg.vocab_size:
            raise EaglewireError(f"{cfg.data / TENSORS_FILE}: a draft vocab exists; --vocab-size applies only without one")
        vocab = load_vocab(cfg.data)
        if vocab.vocab_size != V:
            raise EaglewireError(f"{cfg.data / TENSORS_FILE}: maps a vocabulary of {vocab.vocab_size} tokens, "
                                 f"the target has {V}")
        source = TENSORS_FILE
    else:
        counts = count_tokens([it[1] for it in ds.items], [it[2] for it in ds.items], V)
        vocab = build_draft_vocab(counts, cfg.vocab_size or auto_vocab_size(V))
        source = f"counted over {RESPONSES}"
    ds.manifest.vocab = {"size": vocab.size, "coverage": vocab.coverage,
                         "num_distinct": int((vocab.counts > 0).sum()), "source": source}
    return vocab


def online_source(cfg) -> str:
    """The target `data generate` recorded (the answers are its own); --target may only name the same one."""
    recorded = recorded_generate(cfg.data).get("target")
    if not (cfg.target or recorded):
        raise EaglewireError(f"{cfg.data}: --online needs --target (no {GENERATE_CONFIG} records one)")
    if cfg.target and recorded and resolve_target_dir(cfg.target).resolve() != resolve_target_dir(recorded).resolve():
        raise EaglewireError(f"{cfg.data / GENERATE_CONFIG}: the answers were generated by {recorded!r}, not --target "
                             f"{cfg.target!r}: training on another target's answers teaches the drafter the wrong "
                             "distribution (leave --target out, or regenerate the answers)")
    return cfg.target or recorded


def generate_settings(cfg) -> dict:
    """The generation settings `data generate` recorded with the answers (the manifest's `generation`)."""
    gen_cfg = cfg.data / "generate.config.json"
    return json.loads(gen_cfg.read_text()).get("result", {}).get("settings", {}) if gen_cfg.is_file() else {}


def setup_online(cfg, device: torch.device, need_vocab: bool = True, default_points=None) -> TrainInputs:
    """What `train --online` trains on, as `loop._setup` finds it offline.

    The target is loaded like offline training loads it (fp32, CPU), so the
    drafter's init and the frozen head are the same; `place` then moves it to
    the training device in --dtype for the forwards.
    """
    rows = read_responses(cfg.data)
    target = load_target(online_source(cfg), device="cpu")
    check_answer_vocab(cfg.data / RESPONSES, rows, target.vocab_size)
    ds = OnlineDataset(cfg.data, rows, target, cfg.points, cfg.store_dtype, cfg.max_len, generate_settings(cfg),
                       resolve_dtype(cfg.dtype, device), default_points)
    return online_inputs(cfg, ds, target, need_vocab)


def online_inputs(cfg, ds: OnlineDataset, target, need_vocab: bool) -> TrainInputs:
    """The run's inputs around an online dataset: its draft vocab and the provenance the checkpoint records."""
    man = ds.manifest
    vocab = _vocab(cfg, ds, target.vocab_size) if need_vocab else None
    prov = Provenance(points=man.points, target=man.target, chat_template_sha=man.chat_template_sha, vocab=man.vocab,
                      # no manifest: the responses file is the training data's identity
                      dataset={"path": str(Path(cfg.data).resolve()), "manifest_sha": None, "online": True,
                               "responses_sha": file_sha256(cfg.data / RESPONSES)[:16],
                               "store_dtype": cfg.store_dtype, "dropped": man.dropped,
                               **({"capture": man.capture} if ds.capture is not None else {})})
    return TrainInputs(ds, man, target, vocab, prov)
