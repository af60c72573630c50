"""`doctor config` for a P-EAGLE drafter: the rows an EAGLE-3 check cannot see, as vLLM 0.32.0 reads them.

A P-EAGLE export is an EAGLE-3 export (same ids, same tensors: the EAGLE-3
rows of engine_config.py check those) plus three things that only matter
when vLLM drafts in parallel (docs/parallel-drafters.md section 8), each of
which is served wrongly without an error or refused at start:

- parallel drafting itself: the speculators layout turns it on with
  ``speculators_model_type: "peagle"`` (``transformers_utils/configs/
  speculators/base.py`` ``build_vllm_speculative_config``); as ``eagle3`` vLLM
  drafts the drafter as a chain and skips ``mask_hidden``. The ``vllm``
  layout cannot say it: ``parallel_drafting`` is the serving command's.
- the mask token: ``v1/spec_decode/llm_base_proposer.py``
  ``_init_parallel_drafting_params`` takes the first of
  ``dflash_config.mask_token_id``, ``mask_token_id``, ``dspark_noise_token_id``,
  ``pard_token``, ``ptd_token_id`` on the draft's hf_config (none: a
  ValueError at start); in the speculators layout that hf_config is
  ``transformer_layer_config`` plus ``pard_token`` = the top-level
  ``mask_token_id`` (``algos.py`` ``update_peagle``, a KeyError without it).
  Another id than the trained one feeds every mask slot an embedding the
  drafter never saw.
- ``mask_hidden``: ``model_executor/models/llama_eagle3.py`` loads it into a
  ``[1, fc_input_size]`` buffer with ``view(1, -1)``; missing with parallel
  drafting on is a ValueError, another size a failed copy.

``update_peagle`` also forwards only ``norm_before_residual`` (default False,
not eagle3's True) and ``norm_before_fc``: a drafter trained with ``fc_norm``
or ``norm_output`` is served without them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from safetensors import safe_open

from eaglewire.doctor.records import layer_config, recorded_field, trained_entry
from eaglewire.doctor.verdict import Report
from eaglewire.export.written import RECORD
from eaglewire.saved.peagle import MASK_HIDDEN, PEAGLE_KEY
from eaglewire.targets.points import Engine

SPEC_TYPE = "peagle"  # speculators_model_type vLLM turns into eagle3 + parallel_drafting
# _init_parallel_drafting_params, after dflash_config.mask_token_id: mask_token_id is taken when not None, the
# others when present at all (hasattr)
MASK_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")


def _trained(d: Path) -> tuple[int | None, int | None, bool]:
    """(mask token id, depths) the drafter was trained with, and whether anything records it as P-EAGLE."""
    entry = trained_entry(d, PEAGLE_KEY) or {}
    try:
        kind = json.loads((d / RECORD).read_text()).get("kind")
    except (OSError, ValueError, RecursionError, AttributeError):
        kind = None
    peagle = kind == "p-eagle" or bool(entry)
    mask = recorded_field(d, "mask_token_id") if kind == "p-eagle" else None
    depths = recorded_field(d, "depths") if kind == "p-eagle" else None
    return (mask if mask is not None else entry.get("mask_token_id"),
            depths if depths is not None else entry.get("depths"), peagle)


def _shapes(d: Path) -> dict[str, list[int]]:
    """Tensor name -> shape over the directory's safetensors ({} when none or unreadable: the EAGLE-3 weight rows
    already say which)."""
    out: dict[str, list[int]] = {}
    for fp in sorted(d.glob("*.safetensors")) if d.is_dir() else []:
        try:
            with safe_open(str(fp), framework="pt") as f:
                out.update({k: list(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception:  # noqa: BLE001  damaged weights: the EAGLE-3 `weights` row names them
            return {}
    return out


def vllm_reads_mask(cfg: dict) -> tuple[str | None, object]:
    """(key, value) of the mask token id vLLM 0.32.0 drafts with, in `_init_parallel_drafting_params`'s order on
    the hf_config it builds from this config.json; (None, None): none, vLLM refuses to start."""
    speculators = "speculators_model_type" in cfg
    inner_cfg = cfg.get("transformer_layer_config")
    hf = (dict(inner_cfg) if isinstance(inner_cfg, dict) else {}) if speculators else dict(cfg)
    where = "transformer_layer_config." if speculators else ""
    if speculators:  # update_peagle: pard_token = the top-level mask_token_id (a KeyError without it)
        if "mask_token_id" not in cfg:
            return None, None
        hf["pard_token"] = cfg["mask_token_id"]
    inner = hf.get("dflash_config")
    if isinstance(inner, dict) and "mask_token_id" in inner:
        return f"{where}dflash_config.mask_token_id", inner["mask_token_id"]
    for k in MASK_KEYS:
        if k in hf and (k != "mask_token_id" or hf[k] is not None):
            return ("mask_token_id" if speculators and k == "pard_token" else where + k), hf[k]
    return None, None


def is_peagle(d: Path, cfg: dict) -> bool:
    """Trained as P-EAGLE (the export record or checkpoint says so) or deployed as one (its config or weights)."""
    return (_trained(d)[2] or cfg.get("speculators_model_type") == SPEC_TYPE or MASK_HIDDEN in _shapes(d)
            or (cfg.get("speculators_model_type") is None and cfg.get("mask_token_id") is not None))


def check_peagle(rep: Report, cfg: dict, d: Path, eng: Engine, trained_cfg: dict | None) -> None:
    """The P-EAGLE rows of `doctor config` (nothing for any other drafter)."""
    if not is_peagle(d, cfg):
        return
    mask, depths, _ = _trained(d)
    rep.data["kind"] = "p-eagle"
    rep.data["peagle"] = {"trained_mask_token_id": mask, "trained_depths": depths}
    if eng.name == "sglang":
        rep.add("parallel drafting", False, "SGLang 0.5.23 has no P-EAGLE (no parallel EAGLE drafting, no "
                "mask_hidden): it would draft this drafter as a chain", "serve it with vLLM >= 0.32: `eaglewire "
                "export CKPT --format vllm`, served with parallel_drafting (or --format speculators)")
        return
    if not _check_parallel(rep, cfg, depths):
        return
    _check_mask_id(rep, cfg, mask)
    _check_mask_hidden(rep, _shapes(d))
    if "speculators_model_type" in cfg:
        _check_speculators_norms(rep, cfg, trained_cfg)


def _check_parallel(rep: Report, cfg: dict, depths: int | None) -> bool:
    """Whether vLLM drafts in parallel at all (False: a chain, so no mask row applies)."""
    k = f"\"num_speculative_tokens\": {depths if depths else 'K'}"
    if "speculators_model_type" not in cfg:
        rep.add("parallel drafting", True, "vllm layout: config.json cannot turn it on; vLLM drafts in parallel only "
                f'when served with --speculative-config {{"method": "eagle3", "parallel_drafting": true, {k}}} '
                "(`eaglewire serve` does); without it, a chain that skips mask_hidden")
        return True
    smt = cfg.get("speculators_model_type")
    if smt != SPEC_TYPE:
        rep.add("parallel drafting", False, f"speculators_model_type {smt!r}: vLLM drafts this P-EAGLE drafter as a "
                "chain (no parallel_drafting; mask_hidden skipped), from hidden states it was not trained to read",
                f'set "speculators_model_type": "{SPEC_TYPE}" and "mask_token_id" (or re-export: `eaglewire export CKPT '
                "--format speculators`)")
        return False
    sc = cfg.get("speculators_config")  # a malformed one reads as "no count given", never a traceback
    methods = sc.get("proposal_methods") if isinstance(sc, dict) else None
    first = methods[0] if isinstance(methods, list) and methods else {}
    served = first.get("speculative_tokens") if isinstance(first, dict) else None
    rep.add("parallel drafting", True, f"speculators_model_type {SPEC_TYPE!r}: vLLM serves it as eagle3 with "
            f"parallel_drafting, {served} drafts per round (speculative_tokens)")
    if depths and isinstance(served, int) and served > depths:
        rep.add("drafts per round", False, f"speculative_tokens {served} > the {depths} depths trained: drafts "
                f"{depths + 1}..{served} come from mask slots no training step reached", f'set "speculative_tokens": '
                f"{depths} in speculators_config.proposal_methods[0]", level="warning")
    return True


def _check_mask_id(rep: Report, cfg: dict, trained: int | None) -> None:
    key, served = vllm_reads_mask(cfg)
    vocab = (layer_config(cfg)).get("vocab_size")
    want = trained if trained is not None else "M"
    if key is None:
        rep.add("mask token", False, "no mask token id: vLLM 0.32.0 refuses to start with parallel drafting (\"the "
                "draft model config must have ... mask_token_id ...\")", f'set "mask_token_id": {want} at the top '
                "level of config.json")
        return
    if isinstance(served, bool) or not isinstance(served, int) or (isinstance(vocab, int) and not 0 <= served < vocab):
        rep.add("mask token", False, f"{key} = {str(served)[:40]}: expected an id of the target vocabulary "
                f"[0, {vocab - 1 if isinstance(vocab, int) else 'vocab_size - 1'}]", f'set "mask_token_id": {want}')
        return
    if trained is None:
        rep.add("mask token", True, f"vLLM reads {key} = {served}; the trained mask token is not recorded here")
        return
    first = "" if key == "mask_token_id" else f" (vLLM reads {key} before the top-level mask_token_id: remove it)"
    rep.add("mask token", served == trained, f"vLLM reads {key} = {served}; the drafter was trained with mask "
            f"token {trained}" + ("" if served == trained else ": every mask slot's input is an embedding it never "
                                  "saw"), f'set "mask_token_id": {trained}{first}')


def _check_mask_hidden(rep: Report, shapes: dict[str, list[int]]) -> None:
    if not shapes:
        return  # config only: the EAGLE-3 `weights` row says so
    name = next((k for k in shapes if k == MASK_HIDDEN or k.endswith("." + MASK_HIDDEN)), None)
    fc = next((v for k, v in shapes.items() if k == "fc.weight" or k.endswith(".fc.weight")), None)
    if name is None:
        rep.add(MASK_HIDDEN, False, "no mask_hidden tensor: vLLM with parallel_drafting refuses to load (\"mask_hidden "
                "not found in weights\")", "re-export from the P-EAGLE checkpoint (`eaglewire export CKPT --format "
                "vllm`)")
        return
    n = math.prod(shapes[name])
    width = fc[1] if fc and len(fc) == 2 else None
    ok = width is None or n == width
    rep.add(MASK_HIDDEN, ok, f"{name} {shapes[name]}: {n} values" + (
        "" if width is None else f"; the fc takes {width} inputs (vLLM copies it into a [1, {width}] buffer)"),
        "the mask_hidden and the fc come from different drafters: re-export the checkpoint")


def _check_speculators_norms(rep: Report, cfg: dict, trained_cfg: dict | None) -> None:
    """update_peagle forwards norm_before_residual (absent: False) and norm_before_fc only."""
    lost = [k for k in ("fc_norm", "norm_output") if (trained_cfg or {}).get(k) or cfg.get(k)]
    residual = cfg.get("norm_before_residual", False)
    bad = [f"{k} is dropped by vLLM's update_peagle" for k in lost]
    if trained_cfg is not None and bool(trained_cfg.get("norm_before_residual", False)) != bool(residual):
        bad.append(f"norm_before_residual is served {residual} (update_peagle's default False when absent), trained "
                   f"{trained_cfg.get('norm_before_residual', False)}")
    if lost or bad:
        rep.add("peagle norms", False, "; ".join(bad), "export --format vllm (it carries every norm switch)" if lost
                else f'set "norm_before_residual": {json.dumps(bool(trained_cfg.get("norm_before_residual")))}')
