"""The drafter checkpoint: SGLang/SpecForge layout plus eaglewire provenance.

`config.json` + `model.safetensors` load in SGLang/SpecForge as
`LlamaForCausalLMEagle3` (`midlayer.*`, d2t/t2d included) when SGLang can serve
the drafter as trained: the config is then exactly `eaglewire export --format
sglang`'s (written by saved.formats, the one writer of engine configs), plus
the drafter's own config. Otherwise config.json claims no engine and lists
why (`not_servable_as_is`), so SGLang refuses it rather than serving it with
the wrong features; `eaglewire export` says which format can. `eaglewire.json`
carries what those formats cannot: the capture points by physical name, the
target fingerprint, the dataset manifest hash, the chat-template hash, the
resolved training config and the final validation metrics. Loading is strict:
a missing or extra tensor is an error, never a silently random weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglewire.drafter.config import DrafterConfig
from eaglewire.drafter.model import Eagle3Drafter
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import close_path_hint
from eaglewire.saved.depth import DEPTH
from eaglewire.saved.formats import DRAFTER_KEY, checkpoint_config
from eaglewire.saved.peagle import PEAGLE_KEY, peagle_record, read_peagle
from eaglewire.saved.provenance import Provenance

WEIGHTS = "model.safetensors"


def save_checkpoint(out: Path, model: Eagle3Drafter, prov: Provenance, depths: int = DEPTH) -> Path:
    """Write atomically: a temp dir renamed into place, so a crash never leaves half a checkpoint.

    A :class:`PEagleDrafter` also records its mask id and ``depths`` (the parallel positions it was trained
    for) under ``PEAGLE_KEY``, so that it loads as one (saved/peagle.py)."""
    if prov.points is None or prov.num_layers is None:
        raise EaglewireError(f"{out}: a checkpoint needs its capture points and the target's layer count")
    out = Path(out)
    with atomic_dir(out) as tmp:
        sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / WEIGHTS), metadata={"format": "pt"})
        config = checkpoint_config(model.config, prov.points, prov.num_layers, prov.fingerprint.model_type)
        if isinstance(model, PEagleDrafter):
            config[PEAGLE_KEY] = peagle_record(model.mask_token_id, depths)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        prov.save(tmp)
    return out


def resolve_dir(d: Path) -> Path:
    """A training run directory stands for its `drafter/` checkpoint."""
    d = Path(d)
    return d / "drafter" if not (d / "config.json").is_file() and (d / "drafter" / "config.json").is_file() else d


def read_provenance(d: Path) -> Provenance:
    return Provenance.load(resolve_dir(d))


def load_state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix != ".safetensors":
        raise EaglewireError(f"{path}: only safetensors weights are loaded here (got {path.suffix})")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise EaglewireError(f"{path}: cannot read safetensors ({e})") from e


def load_checkpoint(d: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(Eagle3Drafter, provenance). Strict: names and shapes must match the config exactly."""
    d = resolve_dir(d)
    cfg_path = d / "config.json"
    if not d.exists():
        raise EaglewireError(f"{d}: does not exist (expected a drafter checkpoint or training run directory)"
                             f"{close_path_hint(d)}")
    if not cfg_path.is_file():
        raise EaglewireError(f"{d}: no config.json (not a drafter checkpoint)")
    try:
        raw = json.loads(cfg_path.read_text())
    except (ValueError, RecursionError) as e:  # bad JSON, bytes that are not UTF-8, nesting too deep
        raise EaglewireError(f"{cfg_path}: not valid JSON ({str(e)[:80]}); re-export or retrain the drafter") from e
    if not isinstance(raw, dict) or DRAFTER_KEY not in raw:
        raise EaglewireError(f"{cfg_path}: not written by eaglewire (convert it with `eaglewire import`)")
    try:
        cfg = DrafterConfig.from_dict(raw[DRAFTER_KEY])
    except (ValueError, TypeError) as e:
        raise EaglewireError(f"{cfg_path}: {DRAFTER_KEY}: {e}") from e
    peagle = read_peagle(raw, cfg_path)
    prov = read_provenance(d)
    mask = None if peagle is None else peagle["mask_token_id"]
    try:
        model = checked_model(cfg, load_state(d / WEIGHTS), d / WEIGHTS, mask)
    except ValueError as e:  # a mask id outside the vocabulary (PEagleDrafter's own check)
        raise EaglewireError(f"{cfg_path}: {PEAGLE_KEY}: {e}") from e
    return model.to(device=device, dtype=dtype).eval(), prov


def checked_model(cfg: DrafterConfig, sd: dict, where, mask_token_id: int | None = None) -> Eagle3Drafter:
    """The drafter holding `sd` (a :class:`PEagleDrafter` when a mask id is given), allocated only once its
    shapes (a storage-free model on the meta device) match the tensors read: a config that claims more than
    the weights hold allocates nothing."""
    def make():
        return Eagle3Drafter(cfg) if mask_token_id is None else PEagleDrafter(cfg, mask_token_id)

    with torch.device("meta"):
        shapes = make()
    check_state(shapes, sd, where)
    model = make()
    model.load_state_dict(sd, strict=True)
    return model


def check_state(model: Eagle3Drafter, sd: dict, where) -> None:
    """Precise errors for the ways real checkpoints go wrong (missing, extra, shape, d2t range)."""
    want = model.state_dict()
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise EaglewireError(f"{where}: tensors do not match the config: missing {missing or 'none'}, unexpected {extra or 'none'}")
    for k, v in want.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise EaglewireError(f"{where}: {k} has shape {list(sd[k].shape)}, config implies {list(v.shape)}")
    if why := corrupt_weights(sd):
        raise EaglewireError(f"{where}: {why}")
    d2t = sd["d2t"].long()
    tgt = d2t + torch.arange(d2t.numel())
    V = model.config.vocab_size
    if int(tgt.min()) < 0 or int(tgt.max()) >= V:
        raise EaglewireError(f"{where}: d2t maps draft ids outside the target vocab [0, {V}) "
                             "(d2t must hold OFFSETS: target = draft + d2t[draft], not absolute ids)")
    if not torch.equal(torch.zeros(V, dtype=torch.bool).index_fill_(0, tgt, True), sd["t2d"].bool()):
        raise EaglewireError(f"{where}: t2d disagrees with d2t (t2d[target] must be True exactly for draft + d2t[draft])")


def corrupt_weights(sd: dict[str, torch.Tensor]) -> str | None:
    """Why these weights cannot be a trained drafter (integer or non-finite values), or None.

    A NaN weight loads and decodes "fine" until the first sampled step fails on NaN
    probabilities; an int32 weight is a conversion bug. d2t/t2d are integer and bool by design.
    """
    for k, v in sorted(sd.items()):
        if k in ("d2t", "t2d"):
            continue
        if not v.is_floating_point():
            return f"{k} is {str(v.dtype).replace('torch.', '')}, expected floating-point weights"
        bad = int((~torch.isfinite(v)).sum())
        if bad:
            return f"{k} has {bad} non-finite values (NaN/inf) of {v.numel()}: corrupt weights"
    return None
