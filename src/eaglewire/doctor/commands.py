"""What each `eaglewire doctor` command does, as library functions returning the verdict (doctor/cli.py prints it).

`live_check` is also `eaglewire serve`'s check before "ready": one function, so a server
`serve` started and one checked later by `doctor live` are held to the same prediction
(same prompts, same gate: the p_min `serve` recorded unless --p-min overrides it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from eaglewire.data.config import RESPONSES
from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.jsonl import read_jsonl, response_problem
from eaglewire.data.manifest import Manifest
from eaglewire.decoding.compat import load_drafter_for
from eaglewire.decoding.engine import SpecEngine
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.doctor.config import (
    DoctorDatasetConfig,
    DoctorDrafterConfig,
    DoctorEngineConfig,
    DoctorLiveConfig,
    DoctorOnlineConfig,
)
from eaglewire.doctor.dataset import doctor_dataset
from eaglewire.doctor.dflash_live import dflash_prediction_for, is_dflash_checkpoint, refuse_dflash
from eaglewire.doctor.drafter import doctor_drafter
from eaglewire.doctor.engine_config import doctor_config, user_training
from eaglewire.doctor.inference import doctor_online
from eaglewire.doctor.live import doctor_live, offline_acceptance, static_check_for
from eaglewire.doctor.records import (
    exported_for,
    recorded_export,
    recorded_gate,
    target_source_for,
    trained_model_config,
    trained_wiring,
)
from eaglewire.doctor.verdict import Report
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.device import resolve_device
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint, read_provenance, resolve_dir
from eaglewire.targets.chat import encode, render
from eaglewire.targets.fingerprint import chat_template_hash
from eaglewire.targets.load import load_head_weight, load_target, load_tokenizer
from eaglewire.targets.points import points_from_ids


def _say(quiet: bool) -> Callable[[str], None]:
    """Progress lines on stderr; none under --json (a script reads stdout and wants no chatter)."""
    return (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def dataset_report(cfg: DoctorDatasetConfig) -> Report:

    man = Manifest.load(cfg.data)
    t = load_target(target_source_for(cfg.target, man.target.source, cfg.data), device=resolve_device(cfg.device))
    return doctor_dataset(cfg.data, t, cfg.samples)


def drafter_report(cfg: DoctorDrafterConfig) -> Report:

    refuse_dflash(cfg.ckpt, "drafter", "`eaglewire doctor live` compares a server with its block decoding, "
                  "`eaglewire doctor config` checks the exported ids")
    model, prov = load_checkpoint(resolve_dir(cfg.ckpt))
    if isinstance(model, PEagleDrafter):  # its chain is what vLLM serves without parallel_drafting, not what it serves
        raise EaglewireError(f"{cfg.ckpt}: a P-EAGLE drafter; `doctor drafter` replays EAGLE-3 chains, which vLLM "
                             "serves only without parallel_drafting: `eaglewire doctor live` compares a server with "
                             "its parallel drafts, `eaglewire doctor config` checks the export")
    t = load_target(target_source_for(cfg.target, prov.target.source, cfg.ckpt))
    if (model.config.vocab_size, model.config.target_hidden_size) != (t.vocab_size, t.hidden_size):
        raise EaglewireError(f"drafter {cfg.ckpt} does not fit target {t.source!r}: it expects vocab "
                             f"{model.config.vocab_size} and hidden size {model.config.target_hidden_size}, the target "
                             f"has {t.vocab_size} and {t.hidden_size} (pass the target it was trained for with --target)")
    head_w = t.model.get_output_embeddings().weight.detach().float()
    return doctor_drafter(model, prov, cfg.data, head_w, cfg.samples, cfg.depth, t.tokenizer)


def config_report(cfg: DoctorEngineConfig) -> Report:

    if (cfg.trained_with or cfg.trained_points) and cfg.trained_on:
        raise EaglewireError("--trained-on and --trained-with / --trained-points both given: one says how it was trained")
    src = resolve_dir(cfg.trained_on) if cfg.trained_on else cfg.drafter_dir
    names, L, model_type, trained_sha = trained_wiring(src)
    L = cfg.target_layers or L
    arch = cfg.arch or model_type
    serving_sha = None
    if cfg.target:
        t = load_target(cfg.target)
        L, serving_sha = t.num_layers, chat_template_hash(t.tokenizer)
        arch = cfg.arch or t.arch
    engine = cfg.engine or exported_for(cfg.drafter_dir)
    if not engine:  # the same ids mean other layers to another engine: never guess which one serves it
        raise EaglewireError(f"{cfg.drafter_dir}: records no export (no eaglewire.export.json): name the engine that will "
                             "serve it with --engine (sglang, sglang==VERSION, vllm, speculators, ...)")
    names, producer = user_training(cfg.trained_with, cfg.trained_points, names, L, src)
    return doctor_config(cfg.drafter_dir, engine, L, names, trained_sha, serving_sha, trained_model_config(src), arch,
                         trained_with=producer, pp=cfg.pipeline_parallel_size)


def live_check(url: str, ckpt: Path, source: str, *, prompts: Path | None, num_prompts: int, max_new_tokens: int,
               served_drafter: Path | None = None, p_min: float | None = None, deadline_s: float = 900.0,
               max_model_len: int = 0, quiet: bool = False) -> Report:
    """The running server at `url` against eaglewire's prediction for checkpoint `ckpt` on target `source`.

    `p_min` None: the gate `serve` recorded for this run (llama.cpp only), else none; `max_model_len` > 0: only
    the prompts a server of that context can answer whole (serve knows it, doctor live does not)."""

    say = _say(quiet)
    say(f"[live] loading target {source} and drafter {ckpt}")
    gate_from = ""
    if p_min is None:
        p_min, rec = recorded_gate(ckpt)
        p_min, gate_from = (p_min, str(rec)) if p_min else (0.0, "")
    t = load_target(source)
    if is_dflash_checkpoint(ckpt):  # one block forward per round: the prediction decodes blocks, not chains
        engine, points = dflash_prediction_for(t, ckpt)
    else:  # a P-EAGLE drafter drafts its K positions in one forward (vLLM parallel_drafting): predicted so
        drafter, points, _ = load_drafter_for(t, ckpt)
        engine = (ParallelEngine if isinstance(drafter, PEagleDrafter) else SpecEngine)(t, drafter, points)
    ids = encode_prompt_file(engine, prompts or heldout_prompts_path(), num_prompts)[0]
    if max_model_len:
        ids = fitting_prompts(ids, max_new_tokens, max_model_len)
    static = static_check_for(served_drafter or recorded_export(ckpt), [p.name for p in points], t.num_layers, t.arch)
    return doctor_live(url.rstrip("/"), engine, ids, max_new_tokens, static,
                       target=[source, str(t.path), str(Path(t.path).resolve())], p_min=p_min, deadline_s=deadline_s,
                       say=say, gate_from=gate_from)


def fitting_prompts(prompts: list[list[int]], max_new_tokens: int, max_model_len: int) -> list[list[int]]:
    """The check prompts the server can answer whole (prompt and new tokens within its context); none is one line
    naming the sizes, where the server would refuse every request and the check would compare nothing."""
    fits = [p for p in prompts if len(p) + max_new_tokens <= max_model_len]
    if not fits:
        short = min(len(p) for p in prompts)
        raise EaglewireError(f"--max-model-len {max_model_len}: every one of the {len(prompts)} check prompts needs more "
                             f"(the shortest is {short} tokens, plus --max-new-tokens {max_new_tokens}): raise "
                             "--max-model-len, lower --max-new-tokens, or pass --check-prompts 0")
    if len(fits) < len(prompts):
        print(f"note: {len(prompts) - len(fits)} of {len(prompts)} check prompts do not fit --max-model-len "
              f"{max_model_len} with --max-new-tokens {max_new_tokens}; checking the other {len(fits)}",
              file=sys.stderr)
    return fits


def live_report(cfg: DoctorLiveConfig) -> Report:

    if cfg.data is not None:
        return _live_offline(cfg)
    ckpt = resolve_dir(cfg.drafter)
    source = target_source_for(cfg.target, read_provenance(ckpt).target.source, cfg.drafter)
    return live_check(cfg.server, ckpt, source, prompts=cfg.prompts, num_prompts=cfg.num_prompts,
                      max_new_tokens=cfg.max_new_tokens, served_drafter=cfg.served_drafter, p_min=cfg.p_min,
                      deadline_s=cfg.deadline, quiet=cfg.json)


def _live_offline(cfg: DoctorLiveConfig) -> Report:
    """No target in memory: its tokenizer renders the dataset's prompts, its lm_head (read alone) scores drafts."""

    ckpt = resolve_dir(cfg.drafter)
    refuse_dflash(ckpt, "live --data", "run doctor live with the target instead of --data (the prediction then "
                  "decodes blocks on it)")
    model, prov = load_checkpoint(ckpt)
    source = target_source_for(cfg.target, prov.target.source, cfg.drafter)
    tok, head_w = load_tokenizer(source), load_head_weight(source)
    rows = sorted(read_jsonl(cfg.data / RESPONSES, tolerate_partial_tail=False, check=response_problem),
                  key=lambda r: r["index"])
    prompts = [encode(tok, render(tok, r["messages"][:-1], add_generation_prompt=True))
               for r in rows if r.get("messages")][: cfg.num_prompts]
    static = static_check_for(cfg.served_drafter or recorded_export(ckpt), prov.point_names or [], prov.num_layers,
                              prov.fingerprint.model_type)
    return doctor_live(cfg.server.rstrip("/"), None, prompts, cfg.max_new_tokens, static,
                       offline=lambda depth: offline_acceptance(model, cfg.data, head_w, depth, 64),
                       target=[source, *([str(Path(source).resolve())] if Path(source).is_dir() else [])],
                       p_min=cfg.p_min or 0.0, deadline_s=cfg.deadline, say=_say(cfg.json))


def online_report(cfg: DoctorOnlineConfig) -> Report:

    refuse_dflash(resolve_dir(cfg.drafter), "online", "`eaglewire doctor live` and `eaglewire doctor config` check it")
    model, prov = load_checkpoint(resolve_dir(cfg.drafter))
    t = load_target(target_source_for(cfg.target, prov.target.source, cfg.drafter))
    serve = points_from_ids(cfg.serve_ids, cfg.layers_from, t.num_layers, t.arch) if cfg.serve_ids else None
    return doctor_online(t, model, prov, cfg.data, serve, cfg.samples, cfg.max_new_tokens, cfg.depth)
