"""The drafter checkpoint: SGLang/SpecForge layout plus eaglewire provenance.

`config.json` + `model.safetensors` load in SGLang/SpecForge as
`LlamaForCausalLMEagle3` (`midlayer.*`, d2t/t2d included); `eaglewire.json`
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
from eaglewire.infra.atomic import atomic_dir
from eaglewire.infra.errors import EaglewireError
from eaglewire.target.points import id_lists, parse_points

PROVENANCE = "eaglewire.json"
WEIGHTS = "model.safetensors"


def hf_config(cfg: DrafterConfig, sglang_ids: list[int | None]) -> dict:
    """config.json in the LlamaForCausalLMEagle3 shape SGLang and SpecForge read."""
    d = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size, "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu", "torch_dtype": "float32", "norm_before_residual": cfg.norm_before_residual,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": sglang_ids},
        "eaglewire_drafter_config": cfg.to_dict(),
    }
    if cfg.rope_scaling:
        d["rope_scaling"] = cfg.rope_scaling
    return d


def save_checkpoint(out: Path, model: Eagle3Drafter, points: list[str], num_layers: int, provenance: dict) -> Path:
    """Write atomically: a temp dir renamed into place, so a crash never leaves half a checkpoint."""
    pts = parse_points(points, num_layers)
    ids = id_lists(pts, num_layers)
    out = Path(out)
    with atomic_dir(out) as tmp:
        sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(model.config, ids["sglang"]), indent=2))
        prov = {"format": "eaglewire-drafter", "version": 1, "points": ids, "target_num_layers": num_layers, **provenance}
        (tmp / PROVENANCE).write_text(json.dumps(prov, indent=2, default=str))
    return out


def resolve_dir(d: Path) -> Path:
    """A training run directory stands for its `drafter/` checkpoint."""
    d = Path(d)
    return d / "drafter" if not (d / "config.json").is_file() and (d / "drafter" / "config.json").is_file() else d


def read_provenance(d: Path) -> dict:
    d = resolve_dir(d)
    p = Path(d) / PROVENANCE
    if not p.is_file():
        raise EaglewireError(f"{d}: no {PROVENANCE} (not an eaglewire checkpoint; use `eaglewire import`)")
    return json.loads(p.read_text())


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
    if not cfg_path.is_file():
        raise EaglewireError(f"{d}: no config.json (not a drafter checkpoint)")
    raw = json.loads(cfg_path.read_text())
    if "eaglewire_drafter_config" not in raw:
        raise EaglewireError(f"{cfg_path}: not written by eaglewire (convert it with `eaglewire import`)")
    try:
        cfg = DrafterConfig.from_dict(raw["eaglewire_drafter_config"])
    except (ValueError, TypeError) as e:
        raise EaglewireError(f"{cfg_path}: eaglewire_drafter_config: {e}") from e
    prov = read_provenance(d)
    model = Eagle3Drafter(cfg)
    sd = load_state(d / WEIGHTS)
    check_state(model, sd, d / WEIGHTS)
    model.load_state_dict(sd, strict=True)
    return model.to(device=device, dtype=dtype).eval(), prov


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
    d2t = sd["d2t"].long()
    tgt = d2t + torch.arange(d2t.numel())
    V = model.config.vocab_size
    if int(tgt.min()) < 0 or int(tgt.max()) >= V:
        raise EaglewireError(f"{where}: d2t maps draft ids outside the target vocab [0, {V}) "
                             "(d2t must hold OFFSETS: target = draft + d2t[draft], not absolute ids)")
    if not torch.equal(torch.zeros(V, dtype=torch.bool).index_fill_(0, tgt, True), sd["t2d"].bool()):
        raise EaglewireError(f"{where}: t2d disagrees with d2t (t2d[target] must be True exactly for draft + d2t[draft])")
