"""The target an `eaglewire import` resolves ids against: --target loaded, or --target-layers (and --arch) alone.

Why one function for both drafter kinds: the EAGLE-3 import (importer.py) and the DFlash one (dflash_io.py)
take the same three options with the same rules, and a rule mended in one copy and not the other would
record one kind's provenance differently from the other's.
"""

from __future__ import annotations

from eaglewire.export.config import ImportConfig
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord, chat_template_hash
from eaglewire.targets.load import Target, load_target


def import_target(cfg: ImportConfig, ids: str = "ids") -> tuple[int, TargetRecord, str | None, Target | None]:
    """(layer count, target record, chat template hash, the loaded target or None without --target).

    `ids` names what cannot be resolved without a layer count ("DFlash ids"); the caller checks the drafter
    against the loaded target (embedding, head) itself, since what must fit differs by kind."""
    if not cfg.target:
        if cfg.target_layers <= 0:
            raise EaglewireError(f"{ids} cannot be resolved to physical points without the target's layer count: "
                                 "pass --target or --target-layers")
        fp = TargetFingerprint.unknown_target(cfg.target_layers, model_type=cfg.arch or None)
        return cfg.target_layers, TargetRecord(source=None, fingerprint=fp), None, None
    if cfg.arch:
        raise EaglewireError(f"--arch {cfg.arch!r} with --target {cfg.target!r}: the target says its own class; "
                             "--arch is for --target-layers alone")
    t = load_target(cfg.target, device="cpu")
    if cfg.target_layers and cfg.target_layers != t.num_layers:
        raise EaglewireError(f"--target-layers {cfg.target_layers} but target {cfg.target!r} has {t.num_layers} layers")
    record = TargetRecord(source=cfg.target, fingerprint=TargetFingerprint.of(t))
    return t.num_layers, record, chat_template_hash(t.tokenizer), t
