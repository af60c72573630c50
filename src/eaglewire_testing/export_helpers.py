"""Helpers for the export tests: small eaglewire checkpoints with random weights (fast, no target needed)."""

from __future__ import annotations

import torch

from eaglewire.drafter import DrafterConfig, Eagle3Drafter
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.saved.provenance import Provenance
from eaglewire.targets.points import eagle3_default

L = 8  # target layers: default capture = layers.1.out, layers.3.out, layers.4.out


# what a speculators export names as its verifier when the test checkpoint records no target
VERIFIER = "org/target"


def tiny_cfg(**kw) -> DrafterConfig:
    base = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256, target_hidden_size=32,
                vocab_size=97, draft_vocab_size=40)
    base.update(kw)
    return DrafterConfig(**base)


def make_drafter(seed: int = 0, **kw) -> Eagle3Drafter:
    torch.manual_seed(seed)
    m = Eagle3Drafter(tiny_cfg(**kw))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    if m.config.draft_vocab_size < m.config.vocab_size:
        ids = torch.randperm(m.config.vocab_size)[: m.config.draft_vocab_size].sort().values
        m.set_draft_vocab(ids)
    return m.eval()


def make_ckpt(path, points=None, seed: int = 0, **kw):
    m = make_drafter(seed, **kw)
    names = [p.name for p in (points or eagle3_default(L))]
    save_checkpoint(path, m, provenance(names, L))
    return path, m


def draft_logits(model: Eagle3Drafter, seed: int = 1) -> torch.Tensor:
    """Step-0 draft logits on fixed inputs (features, tokens), the quantity engines compute."""
    from eaglewire.drafter import causal_mask

    g = torch.Generator().manual_seed(seed)
    c = model.config
    T = 7
    feats = torch.randn(1, T, c.num_aux * c.target_hidden_size, generator=g)
    ids = torch.randint(0, c.vocab_size, (1, T), generator=g)
    with torch.no_grad():
        h, _ = model.step(ids, model.project(feats), torch.arange(T)[None], None, causal_mask(T))
        return model.logits(h)


def provenance(points, num_layers: int, model_type: str | None = None, **fields) -> Provenance:
    """A checkpoint's provenance for a drafter made in a test: its points and a target known only by shape."""
    from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord
    from eaglewire.targets.points import Point, parse_points

    pts = [p if isinstance(p, Point) else None for p in points]
    pts = pts if None not in pts else parse_points(list(points), num_layers)
    # a made-up target known by its shape and a fake hash: a test drafter has no real target to fingerprint
    fp = TargetFingerprint(num_layers=num_layers, model_type=model_type, config_sha="test-drafter")
    return Provenance(points=pts, target=TargetRecord(source=None, fingerprint=fields.pop("fingerprint", fp)), **fields)


def break_weights(path, kind: str) -> None:
    """Replace a weights file by garbage bytes, a directory or a symlink loop (what a reader must survive)."""
    import os
    from pathlib import Path

    p = Path(path)
    p.unlink()
    if kind == "garbage":
        p.write_bytes(b"\x00not safetensors at all" * 10)
    elif kind == "directory":
        p.mkdir()
    else:
        os.symlink(p.parent / "loop.safetensors", p)
        os.symlink(p, p.parent / "loop.safetensors")
