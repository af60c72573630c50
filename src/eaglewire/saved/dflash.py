"""The DFlash drafter checkpoint: z-lab layout plus eaglewire provenance.

`config.json` + `model.safetensors` are what z-lab's `DFlashDraftModel`,
SGLang and vLLM load (tensor names = :class:`DFlashDrafter`'s state dict,
the z-lab names; `dflash_config.target_layer_ids` in z-lab meaning, id k =
`layers.{k}.out`), minus `auto_map`: no engine is asked to run remote code.
The drafter's own config rides along under :data:`DFLASH_KEY` and
`eaglewire.json` records the capture points by physical name, so a config
whose ids were edited (the classic off-by-one between the z-lab and vLLM
numberings) is refused at load rather than served one layer off.
Loading is strict as for EAGLE-3: a missing or extra tensor is an error.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.infra.atomic import atomic_dir, read_json
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import close_path_hint
from eaglewire.saved.checkpoint import WEIGHTS, corrupt_weights, load_state, resolve_dir
from eaglewire.saved.provenance import Provenance

DFLASH_KEY = "eaglewire_dflash_config"
ARCH = "DFlashDraftModel"
# transformers' PretrainedConfig bookkeeping: no engine reads it, z-lab's published configs do not carry it
_NOISE = ("transformers_version", "architectures", "output_hidden_states", "output_attentions", "return_dict",
          "dtype", "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
          "problem_type", "_name_or_path", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id")


def zlab_config(cfg: DFlashConfig, num_target_layers: int) -> dict:
    """The z-lab `config.json` (what SGLang and vLLM read): Qwen3 fields plus the DFlash keys.

    `block_size` is written at the top level (z-lab's -b16 drafts) and inside `dflash_config` (newer
    checkpoints), so readers of either place agree; `rope_theta` also at the top level for readers
    that predate `rope_parameters`."""
    q = {k: v for k, v in cfg.qwen3().to_dict().items() if k not in _NOISE}
    return {
        **q, "architectures": [ARCH], "model_type": "qwen3", "rope_theta": cfg.rope_theta,
        "block_size": cfg.block_size, "num_target_layers": int(num_target_layers),
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          "block_size": cfg.block_size},
    }


def save_dflash_checkpoint(out: Path, model: DFlashDrafter, prov: Provenance) -> Path:
    """Write atomically (a temp dir renamed into place): a crash never leaves half a checkpoint."""
    cfg = model.config
    if prov.points is None or prov.num_layers is None:
        raise EaglewireError(f"{out}: a checkpoint needs its capture points and the target's layer count")
    if list(prov.points) != cfg.points:
        raise EaglewireError(f"{out}: provenance points {[p.name for p in prov.points]} are not the drafter's "
                             f"target_layer_ids {list(cfg.target_layer_ids)} (z-lab id k = layers.k.out)")
    out = Path(out)
    with atomic_dir(out) as tmp:
        sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / WEIGHTS), metadata={"format": "pt"})
        config = {**zlab_config(cfg, prov.num_layers), DFLASH_KEY: dataclasses.asdict(cfg)}
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        prov.save(tmp)
    return out


def _raw_config(d: Path) -> dict | None:
    p = d / "config.json"
    if not p.is_file():
        return None
    try:
        raw = json.loads(p.read_text())
    except (ValueError, RecursionError):
        return None
    return raw if isinstance(raw, dict) else None


def is_dflash_checkpoint(d: Path) -> bool:
    """True for a directory (or a training run holding `drafter/`) written by :func:`save_dflash_checkpoint`."""
    raw = _raw_config(resolve_dir(Path(d)))
    return raw is not None and DFLASH_KEY in raw


def config_from_dict(raw, where: str) -> DFlashConfig:
    """The :class:`DFlashConfig` stored under :data:`DFLASH_KEY`; a damaged one is one line naming the field."""
    if not isinstance(raw, dict):
        raise EaglewireError(f"{where}: {DFLASH_KEY} is {str(raw)[:40]}: expected an object")
    names = {f.name for f in dataclasses.fields(DFlashConfig)}
    if unknown := sorted(set(raw) - names):
        raise EaglewireError(f"{where}: {DFLASH_KEY} has unknown fields {unknown}")
    ids = raw.get("target_layer_ids")
    try:
        return DFlashConfig(**{**raw, "target_layer_ids": tuple(ids) if isinstance(ids, list) else ids})
    except (ValueError, TypeError) as e:
        raise EaglewireError(f"{where}: {DFLASH_KEY}: {e}") from e


def _check_ids(cfg: DFlashConfig, raw: dict, prov: Provenance, where: Path) -> None:
    """The z-lab ids engines read, the drafter's own ids and the recorded points must be one wiring."""
    zl = raw.get("dflash_config", {}).get("target_layer_ids") if isinstance(raw.get("dflash_config"), dict) else None
    if zl != list(cfg.target_layer_ids):
        raise EaglewireError(f"{where}: dflash_config.target_layer_ids {zl} disagree with {DFLASH_KEY}."
                             f"target_layer_ids {list(cfg.target_layer_ids)} (z-lab id k = layers.k.out)")
    if prov.points is not None and list(prov.points) != cfg.points:
        raise EaglewireError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} disagree with the capture "
                             f"points the drafter was trained on, {prov.point_names} (eaglewire.json); "
                             "z-lab id k = layers.k.out")


def _read_config(d: Path) -> tuple[DFlashConfig, dict]:
    """(the checkpoint's DFlashConfig, its whole config.json) of a resolved directory, without its weights."""
    if not d.exists():
        raise EaglewireError(f"{d}: does not exist (expected a DFlash drafter checkpoint or training run "
                             f"directory){close_path_hint(d)}")
    cfg_path = d / "config.json"
    raw = read_json(cfg_path, "no config.json (not a drafter checkpoint)")
    if not isinstance(raw, dict) or DFLASH_KEY not in raw:
        raise EaglewireError(f"{cfg_path}: no {DFLASH_KEY} (not a DFlash checkpoint written by eaglewire; "
                             "convert it with `eaglewire import`)")
    return config_from_dict(raw[DFLASH_KEY], str(cfg_path)), raw


def read_dflash_config(d: Path) -> DFlashConfig:
    """A DFlash checkpoint's (or training run's) config alone: what reads one field needs no weights loaded."""
    return _read_config(resolve_dir(Path(d)))[0]


def load_dflash_checkpoint(d: Path, device: torch.device | str = "cpu",
                           dtype: torch.dtype = torch.float32) -> tuple[DFlashDrafter, Provenance]:
    """(DFlashDrafter, provenance). Strict: tensor names and shapes must be exactly the config's."""
    d = resolve_dir(Path(d))
    cfg, raw = _read_config(d)
    cfg_path = d / "config.json"
    prov = Provenance.load(d)
    _check_ids(cfg, raw, prov, cfg_path)
    sd = load_state(d / WEIGHTS)
    check_tensors(cfg, sd, d / WEIGHTS)
    if why := corrupt_weights(sd):
        raise EaglewireError(f"{d / WEIGHTS}: {why}")
    model = DFlashDrafter(cfg)
    model.load_state_dict(sd, strict=True)
    return model.to(device=device, dtype=dtype).eval(), prov


def check_tensors(cfg: DFlashConfig, sd: dict, where) -> None:
    """Exactly the config's tensor names and shapes (checked on a storage-free model), else one line: a missing
    tensor would load as a random weight, a misshapen one as an allocator traceback."""
    with torch.device("meta"):
        want = DFlashDrafter(cfg).state_dict()
    missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
    if missing or extra:
        raise EaglewireError(f"{where}: tensors do not match the config: missing {missing or 'none'}, "
                             f"unexpected {extra or 'none'}")
    for k, v in want.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise EaglewireError(f"{where}: {k} has shape {list(sd[k].shape)}, config implies {list(v.shape)}")
