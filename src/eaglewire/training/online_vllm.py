"""`train --online --engine vllm`: each micro-batch's features from a vLLM capture server; the target is never built.

Why: a 1T-parameter target (Kimi-K2.5) does not fit a trainer, and its
features for a real dataset are terabytes. vLLM holds it (tensor/expert
parallel, on the node it is served from) and answers each micro-batch with the
residual streams at the capture points; the trainer holds the drafter and the
target's embedding and head, read from the shards by name as offline training
reads them (targets/shards.py), so the fingerprint is the shards' own.

Exactness: the samples are `OnlineDataset`'s (the same rows, tokenization,
truncation, drop rule and store-dtype rounding as `data extract`), and the
capture is `data extract --engine vllm`'s, called per micro-batch
(`extract_vllm.vllm_capture`: vLLM's ids, the final norm it cannot capture
applied here with the target's own norm, its refusals). So a run equals offline
training on a dataset that command stored, and in-process capture to vLLM's
float differences (tested on a real vLLM).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from eaglewire.data.answers import check_answer_vocab
from eaglewire.data.config import RESPONSES
from eaglewire.data.extract_vllm import STATES_DIR, CaptureSite, vllm_capture
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.ranks import rank_world
from eaglewire.targets import families
from eaglewire.targets.load import resolve_target_dir
from eaglewire.targets.shards import load_frozen
from eaglewire.training.inputs import TrainInputs
from eaglewire.training.offline import warm_start_layers
from eaglewire.training.online_features import (
    OnlineDataset,
    generate_settings,
    online_inputs,
    online_points,
    online_source,
    read_responses,
)


def setup_online_vllm(cfg, held: ExitStack, need_vocab: bool = True, default_points=None) -> TrainInputs:
    """What `train --online --engine vllm` trains on; the capture session lives in `held` until the run ends.

    Everything that can be refused is refused before a server starts (a start takes minutes).
    """
    _, world = rank_world()
    if world > 1 and not cfg.engine_url:
        raise EaglewireError(f"--engine vllm under torchrun ({world} ranks): start one capture server (`eaglewire "
                             "data extract --engine vllm --print-command` prints its command) and pass --engine-url; "
                             "every rank asks it for its own micro-batches")
    rows = read_responses(cfg.data)
    source = online_source(cfg)
    num_layers = int(families.text_config(families.native_config(resolve_target_dir(source))).num_hidden_layers)
    pts = online_points(cfg.points, num_layers, default_points)
    target = load_frozen(source, warm_start_layers(cfg, _Names([p.name for p in pts])))
    check_answer_vocab(cfg.data / RESPONSES, rows, target.vocab_size)
    managed = not cfg.engine_url
    root = Path(cfg.states_dir or (cfg.out if managed else cfg.data) / STATES_DIR).resolve()
    site = CaptureSite(root, managed and cfg.states_dir is None, cfg.out / "vllm-capture.log", cfg.max_len,
                       "the state saved last (--save-every) is kept: rerun with --resume", "train")
    cap = held.enter_context(vllm_capture(cfg, target, pts, site))
    ds = OnlineDataset(cfg.data, rows, target, [p.name for p in pts], cfg.store_dtype, cfg.max_len,
                       generate_settings(cfg), capture=cap)
    return online_inputs(cfg, ds, target, need_vocab)


class _Names:
    """The one field of a manifest `offline.warm_start_layers` reads, before the dataset (and its manifest) exists."""

    def __init__(self, names: list[str]):
        self.point_names = names
