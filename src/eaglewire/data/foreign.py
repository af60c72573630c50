"""`eaglewire data import`: speculators hidden-state files and SpecForge offline
captures -> an eaglewire feature dataset (manifest.json + safetensors shards).

What the foreign files hold (read from their source):

* speculators 0.9.0 (hs_connectors FileTransfer, train/data.py ArrowDataset):
  `DIR/hidden_states/hs_{i}.safetensors` with `hidden_states [T, K, H]` and
  `token_ids [T]`; the first K-1 slots are the aux features, the last is the
  target's final PRE-norm state (vLLM id L). The loss mask lives in the Arrow
  dataset at DIR (`datasets.save_to_disk`), column `loss_mask`.
* SpecForge (scripts/prepare_hidden_states.py): `DIR/rows_*/data_{i}.ckpt`,
  a torch.save dict with `input_ids [T]`, `loss_mask [T]`,
  `aux_hidden_state [1, T, P*H]` (SGLang capture order) and `hidden_state
  [1, T, H]`, the final POST-norm state (the logits processor's input).

Neither stores which layers were captured, so the points are recorded as
unknown (`names: [null, ...]`) unless the user states them. eaglewire trains
against the final post-norm state; speculators files lack it, so with
--target the target's final norm is applied to the stored pre-norm state
(exact up to the stored dtype), and without it the pre-norm state is stored
and the manifest says so (`target_hidden`): training on it as-is would
compute the soft targets from the wrong tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eaglewire.data.config import DataImportConfig
from eaglewire.data.extract import write_shard
from eaglewire.data.manifest import Manifest
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.weights import load_pickle_weights
from eaglewire.targets.capture import decoder_stack
from eaglewire.targets.fingerprint import TargetFingerprint, TargetRecord, chat_template_hash
from eaglewire.targets.load import load_target
from eaglewire.targets.points import FINAL_NORM, Point, point_option, points_from_ids

_NUM = re.compile(r"(\d+)")


def _index(p: Path) -> int:
    nums = _NUM.findall(p.stem)
    if not nums:
        raise EaglewireError(f"{p}: expected the sample number in the file name (hs_<i>.safetensors, data_<i>.ckpt)")
    return int(nums[-1])


def _numbered(files: list[Path]) -> list[Path]:
    """`files` in sample order; two files parsing to one sample number (hs_1 and hs_01, or hs_0 in two
    folders) are refused naming both: imported, both would be that sample."""
    seen: dict[int, Path] = {}
    for f in files:
        i = _index(f)
        if i in seen:
            a, b = sorted((seen[i], f))
            raise EaglewireError(f"{a} and {b}: both are sample {i} (one file per sample number; remove or "
                                 "renumber one)")
        seen[i] = f
    return [seen[i] for i in sorted(seen)]


def sample_files(src: Path, fmt: str) -> list[Path]:
    """The foreign files of one dataset, in sample order, each sample number once."""
    if fmt == "speculators":
        return _numbered(list(src.glob("hidden_states/hs_*.safetensors")) + list(src.glob("hs_*.safetensors")))
    return _numbered(list(src.glob("rows_*/data_*.ckpt")) + list(src.glob("data_*.ckpt")))


def check_token_ids(f: Path, ids: torch.Tensor, vocab_size: int | None) -> None:
    """Token ids are ids of the target's vocabulary (>= 0 always; below its size when --target gives it),
    refused here naming the file, not later by sample number at the first command that counts them."""
    bad = ((ids < 0) | (ids >= vocab_size)) if vocab_size else ids < 0
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        span = f"the target's vocabulary [0, {vocab_size})" if vocab_size else "token ids (>= 0)"
        raise EaglewireError(f"{f}: token id {int(ids[pos])} at position {pos} is outside {span}")


def detect(src: Path) -> str:
    if list(src.glob("hidden_states/hs_*.safetensors")) or list(src.glob("hs_*.safetensors")):
        return "speculators"
    if list(src.glob("rows_*/data_*.ckpt")) or list(src.glob("data_*.ckpt")):
        return "specforge"
    raise EaglewireError(f"{src}: neither speculators hidden-state files (hidden_states/hs_<i>.safetensors) "
                         "nor SpecForge captures (rows_*/data_<i>.ckpt)")


def _arrow_loss_masks(src: Path) -> list | None:
    """loss_mask column of the speculators Arrow dataset, or None when pyarrow is missing."""
    try:
        import pyarrow.ipc as ipc  # optional: only speculators' Arrow datasets need it
    except ImportError:
        return None
    files = sorted(src.glob("data-*.arrow"), key=lambda p: p.name)
    if not files:
        raise EaglewireError(f"{src}: no Arrow dataset (data-*.arrow) with the loss masks; pass --all-loss to train on every token")
    masks: list = []
    for f in files:
        try:
            with open(f, "rb") as fh:
                masks += ipc.open_stream(fh).read_all().column("loss_mask").to_pylist()
        except (OSError, ValueError, KeyError, TypeError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise EaglewireError(f"{f}: not an Arrow stream with a loss_mask column ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:160] if str(e) else ''})") from e
    return masks


def _speculators_file(f: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden_states [T, K, H], token_ids [T]) of one speculators file, or one line naming what is wrong."""
    try:
        with safe_open(str(f), framework="pt") as h:
            missing = sorted({"hidden_states", "token_ids"} - set(h.keys()))
            if missing:
                raise EaglewireError(f"{f}: no {' or '.join(missing)} (expected a speculators hidden-state file)")
            hs, ids = h.get_tensor("hidden_states"), h.get_tensor("token_ids")
    except (SafetensorError, OSError) as e:
        raise EaglewireError(f"{f}: not a whole safetensors file ({str(e).splitlines()[0][:120]})") from e
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise EaglewireError(f"{f}: token_ids {list(ids.shape)} {ids.dtype} is not [T] integers")
    if hs.dim() != 3 or hs.shape[0] != ids.shape[0] or hs.shape[1] < 2 or not hs.dtype.is_floating_point:
        raise EaglewireError(f"{f}: hidden_states {list(hs.shape)} {hs.dtype} is not [T={ids.shape[0]}, K>=2, H] floats")
    return hs, ids


def _speculators_samples(src: Path, files: list[Path], all_loss: bool):
    masks = None if all_loss else _arrow_loss_masks(src)
    if masks is None and not all_loss:
        raise EaglewireError("speculators loss masks live in an Arrow dataset and pyarrow is not installed: "
                             "pip install pyarrow, or pass --all-loss to train on every token")
    for f in files:
        i = _index(f)
        hs, ids = _speculators_file(f)
        if masks is not None and not (0 <= i < len(masks) and isinstance(masks[i], list)):
            raise EaglewireError(f"{f}: sample {i}, but the dataset's loss_mask column has {len(masks)} rows")
        mask = torch.ones(ids.shape[0], dtype=torch.uint8) if masks is None else torch.tensor(masks[i], dtype=torch.uint8)
        if mask.shape[0] != ids.shape[0]:
            raise EaglewireError(f"{f}: {ids.shape[0]} tokens but the dataset's loss_mask row {i} has {mask.shape[0]}")
        yield f, i, ids.long(), mask, hs[:, :-1], hs[:, -1]


def _specforge_samples(files: list[Path]):
    for f in files:
        d = load_pickle_weights(f)
        if "aux_hidden_state" not in d:
            raise EaglewireError(f"{f}: no aux_hidden_state (captured without --enable-aux-hidden-states: EAGLE-1 data)")
        missing = sorted({"input_ids", "hidden_state", "loss_mask"} - set(d))
        if missing:
            raise EaglewireError(f"{f}: no {' or '.join(missing)} (expected a SpecForge capture)")
        ids, mask = d["input_ids"].reshape(-1).long(), d["loss_mask"].reshape(-1).to(torch.uint8)
        T, H = ids.shape[0], d["hidden_state"].shape[-1] if d["hidden_state"].dim() else 0
        if not T or not H or mask.shape[0] != T or d["hidden_state"].numel() != T * H or d["aux_hidden_state"].numel() % T:
            raise EaglewireError(f"{f}: aux_hidden_state {list(d['aux_hidden_state'].shape)}, hidden_state "
                                 f"{list(d['hidden_state'].shape)} and loss_mask {list(mask.shape)} do not hold "
                                 f"{T} tokens (input_ids)")
        aux, last = d["aux_hidden_state"].reshape(T, -1), d["hidden_state"].reshape(T, -1)
        if aux.shape[-1] % H or not aux.dtype.is_floating_point:
            raise EaglewireError(f"{f}: aux_hidden_state width {aux.shape[-1]} is not a multiple of hidden {H}")
        yield f, _index(f), ids, mask, aux.view(T, -1, H), last


def _stated_points(cfg: DataImportConfig, P: int, L: int | None) -> list[Point] | None:
    """The points the user states for the imported slots, or None when unknown (never guessed)."""
    if cfg.points or cfg.ids:
        if not L:
            raise EaglewireError("--points/--ids need the target's layer count: pass --target or --target-layers")
        if cfg.ids and not cfg.layers_from:
            raise EaglewireError("--ids needs --layers-from ENGINE (the engine meaning of the ids)")
        pts = point_option(cfg.points, L, default=False) or points_from_ids(cfg.ids, cfg.layers_from, L)
        if len(pts) != P:
            raise EaglewireError(f"{len(pts)} points stated but the files hold {P} feature slots")
        return pts
    return None


def _final_norm(cfg: DataImportConfig):
    """(layer count, fingerprint, final norm module or None) from --target."""
    if not cfg.target:
        return (cfg.target_layers or None), None, None, None

    t = load_target(cfg.target, device="cpu")
    return t.num_layers, TargetFingerprint.of(t), decoder_stack(t.model).norm, chat_template_hash(t.tokenizer)


def run_data_import(cfg: DataImportConfig) -> dict:
    src, out = Path(cfg.src), Path(cfg.out)
    if Manifest.exists(out):
        raise EaglewireError(f"{out}: already holds a dataset; choose a new --out")
    fmt = detect(src) if cfg.format == "auto" else cfg.format
    if fmt not in ("speculators", "specforge"):
        raise EaglewireError(f"--format {fmt!r}: expected auto, speculators or specforge")
    files = sample_files(src, fmt)  # duplicates refused before anything is written
    L, fp, norm, tpl = _final_norm(cfg)
    samples = _speculators_samples(src, files, cfg.all_loss) if fmt == "speculators" else _specforge_samples(files)
    notes, th = [], FINAL_NORM.name
    if fmt == "speculators":
        if norm is not None:
            notes.append("target_hidden = the target's final norm applied to the stored final pre-norm state")
        else:
            th = f"layers.{L - 1}.out" if L else "final_prenorm"
            notes.append("speculators files hold the final PRE-norm state and no --target was given to apply the "
                         "final norm: target_hidden is pre-norm, training needs final_norm (re-import with --target)")
    if cfg.all_loss:
        notes.append("loss_mask = 1 on every token (--all-loss): the original assistant-only mask was not read")
    man = Manifest(target=TargetRecord(source=cfg.target or None, fingerprint=fp or TargetFingerprint.unknown_target(L)),
                   points=None, num_slots=0, target_hidden=th, chat_template_sha=tpl,
                   generation={"imported_from": str(src), "format": fmt}, extract={"imported": True, "notes": notes},
                   capture={"engine": fmt, "imported_from": str(src)})  # not ours: say whose capture it is
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        P = _write_samples(out, man, samples, norm, fp, cfg.shard_samples, src)
        if not P:
            raise EaglewireError(f"{src}: no samples found")
        man.points, man.num_slots = _stated_points(cfg, P, L), P
    except EaglewireError:
        _remove_written(out, man, created)  # a refused import leaves nothing behind
        raise
    man.points_stated_by = "user" if man.points is not None else "unknown"
    man.complete = True
    man.save(out)
    return {"out": str(out), "format": fmt, "points": man.point_names, "num_samples": man.num_samples,
            "num_tokens": man.num_tokens, "target_hidden": th, "warnings": notes}


def _write_samples(out: Path, man: Manifest, samples, norm, fp, shard_samples: int, src: Path) -> int | None:
    """Checks and writes every sample in shards; returns the number of feature slots (None: no samples)."""
    buf, P, shape = [], None, None
    for f, idx, ids, mask, feats, last in samples:
        check_token_ids(f, ids, fp.vocab_size if fp else None)
        if norm is not None:
            with torch.no_grad():
                last = norm(last.float()).to(last.dtype)
        P, shape = P or feats.shape[1], shape or (tuple(feats.shape[1:]), last.shape[-1])
        if (tuple(feats.shape[1:]), last.shape[-1]) != shape:
            raise EaglewireError(f"{src}: sample {idx} holds features {list(feats.shape[1:])} and a final state of width "
                                 f"{last.shape[-1]}, the samples before {list(shape[0])} and {shape[1]}")
        buf.append((idx, ids.tolist(), mask.tolist(), feats, last))
        if len(buf) >= shard_samples:
            _flush(out, man, buf)
            buf = []
    if buf:
        _flush(out, man, buf)
    return P


def _remove_written(out: Path, man: Manifest, created: bool) -> None:
    for e in man.shards:
        (out / e["file"]).unlink(missing_ok=True)
    if created and not any(out.iterdir()):
        out.rmdir()


def _flush(out: Path, man: Manifest, buf: list) -> None:
    man.add_shard(write_shard(out, len(man.shards), buf, buf[0][3].dtype))
