"""A target's identity, as stored in every dataset manifest and drafter provenance.

A dataset or drafter made from another target (or a re-tokenized one) must be
refused, and the path is not a reliable identity: hashes of the config, the
tokenizer vocabulary and the embedding weights are. Datasets and drafters
made elsewhere may know only the layer count; that is an *unknown* target,
one encoding (`{"unknown": true, "num_layers": L}`) in every file we write.
Files written before this record existed (the string "unknown", or no
`embedding_sha_bf16`) still read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch  # only here: reading and comparing records stays torch-free (fast CLI)

from eaglewire.infra.checksums import short_sha
from eaglewire.infra.errors import EaglewireError


def chat_template_hash(tokenizer) -> str | None:
    tpl = getattr(tokenizer, "chat_template", None)
    return short_sha(tpl.encode()) if tpl else None


_CONFIG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings")


@dataclass(frozen=True)
class TargetFingerprint:
    num_layers: int | None = None
    model_type: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    config_sha: str | None = None
    tokenizer_sha: str | None = None
    embedding_sha: str | None = None
    # The embedding rounded to bf16: independent of the dtype the target was loaded in
    # (fp32 here, bf16 on CUDA), so a dataset extracted on a GPU matches a CPU training run.
    embedding_sha_bf16: str | None = None
    # The class engines dispatch on (a wrapper's: KimiK25ForConditionalGeneration), beside the language
    # model's geometry above; records written before it existed have none and compare without it.
    arch: str | None = None
    unknown: bool = False
    extra: dict = dataclasses.field(default_factory=dict)  # fields this version does not know, kept as read

    @classmethod
    def of(cls, target) -> TargetFingerprint:
        cfg = target.config.to_dict()
        core = {k: cfg.get(k) for k in _CONFIG_KEYS}
        vocab = json.dumps(sorted(target.tokenizer.get_vocab().items()), ensure_ascii=False).encode()
        w = target.model.get_input_embeddings().weight.detach().to("cpu")
        emb16 = w.to(torch.bfloat16).contiguous().view(torch.int16)
        return cls(num_layers=target.num_layers, model_type=cfg.get("model_type"), hidden_size=target.hidden_size,
                   vocab_size=target.vocab_size, config_sha=short_sha(json.dumps(core, sort_keys=True).encode()),
                   tokenizer_sha=short_sha(vocab),
                   embedding_sha=short_sha(w.to(torch.float32).contiguous().numpy().tobytes()),
                   embedding_sha_bf16=short_sha(emb16.numpy().tobytes()), arch=getattr(target, "arch", None))

    @classmethod
    def unknown_target(cls, num_layers: int | None = None, model_type: str | None = None) -> TargetFingerprint:
        return cls(num_layers=num_layers, model_type=model_type, unknown=True)

    @classmethod
    def from_json(cls, raw: Any, where: str = "fingerprint") -> TargetFingerprint:
        if raw is None or raw == "unknown":  # the string form of files written before this record
            return cls.unknown_target()
        if not isinstance(raw, dict):
            raise EaglewireError(f"{where}: expected an object of target fingerprint fields, got {raw!r}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in raw.items() if k in names}
        fp = cls(**known, extra={k: v for k, v in raw.items() if k not in names})
        if fp.num_layers is not None and (isinstance(fp.num_layers, bool) or not isinstance(fp.num_layers, int)
                                          or fp.num_layers < 1):
            raise EaglewireError(f"{where}.num_layers: expected a positive integer, got {fp.num_layers!r}")
        if fp.config_sha is None and fp.embedding_sha is None and fp.embedding_sha_bf16 is None:
            return dataclasses.replace(fp, unknown=True)  # nothing to compare: a record made elsewhere
        return fp

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "unknown")}
        d = {k: v for k, v in d.items() if v is not None}
        if self.unknown:
            d["unknown"] = True
        return {**self.extra, **d}

    def mismatch(self, other: TargetFingerprint) -> list[str]:
        """Field names on which two known fingerprints differ (empty when same target, or either is unknown).

        `embedding_sha_bf16` decides when both records have it; records written
        before it existed compare on `embedding_sha` alone.
        """
        if self.unknown or other.unknown:
            return []
        a, b = self.to_json(), other.to_json()
        skip = {"embedding_sha"} if a.get("embedding_sha_bf16") and b.get("embedding_sha_bf16") else {"embedding_sha_bf16"}
        skip |= set() if a.get("arch") and b.get("arch") else {"arch"}
        return [k for k in sorted((set(a) | set(b)) - skip) if a.get(k) != b.get(k)]

    def describe_mismatch(self, other: TargetFingerprint) -> str:
        a, b = self.to_json(), other.to_json()
        return ", ".join(f"{k} ({a.get(k)} vs {b.get(k)})" for k in self.mismatch(other))


@dataclass
class TargetRecord:
    """The target a dataset or drafter was made from: how it was named, and what it is."""

    source: str | None
    fingerprint: TargetFingerprint
    path: str | None = None

    @classmethod
    def from_json(cls, raw: Any, where: str) -> TargetRecord:
        if not isinstance(raw, dict):
            raise EaglewireError(f"{where}: expected an object with source and fingerprint, got {raw!r}")
        # 'spec' named the source in artifacts written before 0.2
        return cls(source=raw.get("source") or raw.get("spec"), path=raw.get("path"),
                   fingerprint=TargetFingerprint.from_json(raw.get("fingerprint"), f"{where}.fingerprint"))

    def to_json(self) -> dict:
        return {"source": self.source, "path": self.path, "fingerprint": self.fingerprint.to_json()}
