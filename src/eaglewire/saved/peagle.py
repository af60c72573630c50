"""The config keys a P-EAGLE export adds to an EAGLE-3 one, for vLLM and speculators, and how vLLM is told to run it.

Why a file of its own: a P-EAGLE checkpoint is an EAGLE-3 checkpoint (same
tensors, same layer ids, ``eagle_aux_hidden_state_layer_ids`` in vLLM's
meaning) plus the ``mask_hidden`` tensor and a mask token id, and vLLM only
drafts in parallel when told to. What vLLM 0.32.0 reads (docs/parallel-drafters.md
section 8):

- ``vllm`` format: the top-level ``mask_token_id`` (first of the keys
  ``v1/spec_decode/llm_base_proposer.py`` ``_init_parallel_drafting_params``
  tries after ``dflash_config.mask_token_id``; without one it refuses to
  start); ``parallel_drafting: true`` must be in ``--speculative-config``.
- ``speculators`` format: ``speculators_model_type: "peagle"`` sets
  ``method: eagle3`` and ``parallel_drafting`` by itself
  (``transformers_utils/configs/speculators/base.py``), ``mask_token_id``
  becomes ``pard_token`` (``algos.py`` ``update_peagle``). That updater copies
  ``norm_before_residual`` and ``norm_before_fc`` but not ``fc_norm`` or
  ``norm_output``: a drafter trained with either would be served without it,
  so that pair is refused here.

The eaglewire checkpoint of a P-EAGLE drafter is an EAGLE-3 checkpoint
(saved/checkpoint.py) whose config.json carries :data:`PEAGLE_KEY`
(``{"mask_token_id": M, "depths": K}``, K the depths it was trained for) and
whose weights carry ``mask_hidden``; loading it gives a ``PEagleDrafter``.
"""

from __future__ import annotations

import copy
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

PEAGLE_KEY = "eaglewire_peagle"  # the checkpoint config key that makes an EAGLE-3 checkpoint a P-EAGLE one
MASK_HIDDEN = "mask_hidden"  # the tensor name vLLM (llama_eagle3.py / qwen3_eagle3.py) and speculators load
# update_peagle forwards these two of the EAGLE-3 norm switches; the others are lost on the way to the model
_SPECULATORS_DROPS = ("fc_norm", "norm_output")


def _check_mask(mask_token_id: int, vocab_size: int) -> None:
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or not 0 <= mask_token_id < vocab_size:
        raise EaglewireError(f"P-EAGLE export: mask_token_id = {mask_token_id!r}: expected an id of the target "
                             f"vocabulary, an integer in [0, {vocab_size - 1}]")


def peagle_record(mask_token_id: int, depths: int) -> dict:
    """The :data:`PEAGLE_KEY` entry of a checkpoint's config.json."""
    if isinstance(depths, bool) or not isinstance(depths, int) or depths < 1:
        raise EaglewireError(f"P-EAGLE checkpoint: depths = {depths!r}: expected the number of parallel draft "
                             "positions trained, an integer >= 1")
    return {"mask_token_id": int(mask_token_id), "depths": depths}


def read_peagle(raw: dict, where) -> dict | None:
    """The checked :data:`PEAGLE_KEY` entry of a checkpoint's config.json (None: a plain EAGLE-3 checkpoint).

    A damaged entry is one line naming the field: served with a wrong mask id, every parallel slot drafts noise."""
    if PEAGLE_KEY not in raw:
        return None
    rec = raw[PEAGLE_KEY]
    if not isinstance(rec, dict) or set(rec) != {"mask_token_id", "depths"}:
        raise EaglewireError(f"{where}: {PEAGLE_KEY} is {str(rec)[:40]}: expected an object with exactly "
                             "mask_token_id and depths")
    for k in ("mask_token_id", "depths"):
        v = rec[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "mask_token_id" else 1):
            raise EaglewireError(f"{where}: {PEAGLE_KEY}.{k} = {v!r}: expected an integer "
                                 f"{'>= 0 (a target vocabulary id)' if k == 'mask_token_id' else '>= 1'}")
    return dict(rec)


def vllm_peagle_config(eagle3_config: dict, mask_token_id: int) -> dict:
    """The ``vllm`` format config.json of a P-EAGLE drafter from the EAGLE-3 one (``formats.build_config("vllm")``).

    Adds the top-level ``mask_token_id`` vLLM reads; layer ids and everything else stay (K is the serving
    command's, :func:`vllm_speculative_config`)."""
    _check_mask(mask_token_id, int(eagle3_config["vocab_size"]))
    out = copy.deepcopy(eagle3_config)
    out["mask_token_id"] = mask_token_id
    return out


def speculators_peagle_config(eagle3_config: dict, mask_token_id: int, depths: int) -> dict:
    """The ``speculators`` format config.json (speculators 0.9.0 ``PEagleSpeculatorConfig``) from the EAGLE-3 one
    (``formats.speculators_config``); ``depths`` becomes the proposal's ``speculative_tokens`` (vLLM's K)."""
    _check_mask(mask_token_id, int(eagle3_config["transformer_layer_config"]["vocab_size"]))
    lost = [k for k in _SPECULATORS_DROPS if eagle3_config.get(k)]
    if lost:
        raise EaglewireError(f"P-EAGLE export to the speculators format: vLLM 0.32.0 drops {', '.join(lost)} from a "
                             f"'peagle' config (update_peagle) and would serve another drafter; export --format vllm")
    out = copy.deepcopy(eagle3_config)
    out.update({"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle",
                "mask_token_id": mask_token_id,
                # the embedding is the target's, frozen (speculators trains it for P-EAGLE: a training switch only)
                "embed_requires_grad": False})
    spec = out["speculators_config"]
    spec["algorithm"] = "peagle"
    spec["proposal_methods"][0]["speculative_tokens"] = depths
    return out


def vllm_speculative_config(model_dir: Path | str, k: int) -> dict:
    """``--speculative-config`` for a ``vllm``-format P-EAGLE export: EAGLE-3 with ``parallel_drafting`` on.

    Without ``parallel_drafting`` vLLM drafts sequentially, feeding back its own hidden states, which a P-EAGLE
    drafter was not trained for (and skips ``mask_hidden`` with a warning)."""
    if k < 1:
        raise EaglewireError(f"P-EAGLE serving: num_speculative_tokens = {k}: expected >= 1")
    return {"method": "eagle3", "model": str(model_dir), "num_speculative_tokens": k, "parallel_drafting": True}
