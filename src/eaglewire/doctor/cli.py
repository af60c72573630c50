"""`eaglewire doctor {dataset,drafter,config,online,live}`: verdict table, --json, non-zero exit on problems."""

from __future__ import annotations

from pathlib import Path

import typer

from eaglewire.doctor.config import (
    DoctorDatasetConfig,
    DoctorDrafterConfig,
    DoctorEngineConfig,
    DoctorLiveConfig,
    DoctorOnlineConfig,
)
from eaglewire.infra.options import build_command


def run_dataset(cfg: DoctorDatasetConfig) -> None:
    from eaglewire.data.manifest import Manifest
    from eaglewire.doctor.dataset import doctor_dataset
    from eaglewire.doctor.records import target_source_for
    from eaglewire.infra.device import resolve_device
    from eaglewire.targets.load import load_target

    man = Manifest.load(cfg.data)
    t = load_target(target_source_for(cfg.target, man.target.source, cfg.data), device=resolve_device(cfg.device))
    rep = doctor_dataset(cfg.data, t, cfg.samples)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_drafter(cfg: DoctorDrafterConfig) -> None:
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.doctor.records import target_source_for
    from eaglewire.export.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.infra.errors import EaglewireError
    from eaglewire.targets.load import load_target

    model, prov = load_checkpoint(resolve_dir(cfg.ckpt))
    t = load_target(target_source_for(cfg.target, prov.target.source, cfg.ckpt))
    if (model.config.vocab_size, model.config.target_hidden_size) != (t.vocab_size, t.hidden_size):
        raise EaglewireError(f"drafter {cfg.ckpt} does not fit target {t.source!r}: it expects vocab "
                             f"{model.config.vocab_size} and hidden size {model.config.target_hidden_size}, the target "
                             f"has {t.vocab_size} and {t.hidden_size} (pass the target it was trained for with --target)")
    head_w = t.model.get_output_embeddings().weight.detach().float()
    rep = doctor_drafter(model, prov, cfg.data, head_w, cfg.samples, cfg.depth, t.tokenizer)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_config(cfg: DoctorEngineConfig) -> None:
    from eaglewire.doctor.engine_config import doctor_config, user_training
    from eaglewire.doctor.records import exported_for, trained_model_config, trained_wiring
    from eaglewire.export.checkpoint import resolve_dir
    from eaglewire.infra.errors import EaglewireError
    from eaglewire.targets.fingerprint import chat_template_hash
    from eaglewire.targets.load import load_target

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
    rep = doctor_config(cfg.drafter_dir, engine, L, names, trained_sha, serving_sha, trained_model_config(src), arch,
                        trained_with=producer)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_live(cfg: DoctorLiveConfig) -> None:
    from eaglewire.doctor.records import recorded_export, target_source_for
    if cfg.data is not None:
        return _run_live_offline(cfg)
    from eaglewire.data.heldout import heldout_prompts_path
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.decoding.run import encode_prompt_file
    from eaglewire.doctor.live import doctor_live, static_check_for
    from eaglewire.export.checkpoint import read_provenance, resolve_dir
    from eaglewire.targets.load import load_target

    ckpt = resolve_dir(cfg.drafter)
    source = target_source_for(cfg.target, read_provenance(ckpt).target.source, cfg.drafter)
    t = load_target(source)
    drafter, points, _ = load_drafter_for(t, ckpt)
    engine = SpecEngine(t, drafter, points)
    prompts, _ = encode_prompt_file(engine, cfg.prompts or heldout_prompts_path(), cfg.num_prompts)
    arch = t.arch
    static = static_check_for(cfg.served_drafter or recorded_export(ckpt), [p.name for p in points], t.num_layers, arch)
    rep = doctor_live(cfg.server.rstrip("/"), engine, prompts, cfg.max_new_tokens, static,
                      target=[source, str(t.path), str(Path(t.path).resolve())], p_min=cfg.p_min,
                      deadline_s=cfg.deadline)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def _run_live_offline(cfg: DoctorLiveConfig) -> None:
    """No target in memory: its tokenizer renders the dataset's prompts, its lm_head (read alone) scores drafts."""
    from eaglewire.data.config import RESPONSES
    from eaglewire.data.jsonl import read_jsonl, response_problem
    from eaglewire.doctor.live import doctor_live, offline_acceptance, static_check_for
    from eaglewire.doctor.records import recorded_export, target_source_for
    from eaglewire.export.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.targets.chat import encode, render
    from eaglewire.targets.load import load_head_weight, load_tokenizer

    ckpt = resolve_dir(cfg.drafter)
    model, prov = load_checkpoint(ckpt)
    source = target_source_for(cfg.target, prov.target.source, cfg.drafter)
    tok, head_w = load_tokenizer(source), load_head_weight(source)
    rows = sorted(read_jsonl(cfg.data / RESPONSES, tolerate_partial_tail=False, check=response_problem),
                  key=lambda r: r["index"])
    prompts = [encode(tok, render(tok, r["messages"][:-1], add_generation_prompt=True))
               for r in rows if r.get("messages")][: cfg.num_prompts]
    static = static_check_for(cfg.served_drafter or recorded_export(ckpt), prov.point_names or [], prov.num_layers,
                              prov.fingerprint.model_type)
    rep = doctor_live(cfg.server.rstrip("/"), None, prompts, cfg.max_new_tokens, static,
                      offline=lambda depth: offline_acceptance(model, cfg.data, head_w, depth, 64),
                      target=[source, *([str(Path(source).resolve())] if Path(source).is_dir() else [])],
                      p_min=cfg.p_min, deadline_s=cfg.deadline)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_online(cfg: DoctorOnlineConfig) -> None:
    from eaglewire.doctor.inference import doctor_online
    from eaglewire.doctor.records import target_source_for
    from eaglewire.export.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.targets.load import load_target
    from eaglewire.targets.points import points_from_ids

    model, prov = load_checkpoint(resolve_dir(cfg.drafter))
    t = load_target(target_source_for(cfg.target, prov.target.source, cfg.drafter))
    arch = t.arch
    serve = points_from_ids(cfg.serve_ids, cfg.layers_from, t.num_layers, arch) if cfg.serve_ids else None
    rep = doctor_online(t, model, prov, cfg.data, serve, cfg.samples, cfg.max_new_tokens)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def register(app: typer.Typer) -> None:
    doc = typer.Typer(no_args_is_help=True, help="Find hidden-state wiring bugs: dataset slots, drafter, deployment config, online.")
    build_command(doc, "dataset", DoctorDatasetConfig, run_dataset, "Identify which physical target tensor each stored feature slot holds.")
    build_command(doc, "drafter", DoctorDrafterConfig, run_drafter, "Standalone drafter test: acc per TTT step, offline chain tau, d2t convention.")
    build_command(doc, "config", DoctorEngineConfig, run_config, "Which tensors will this engine feed the drafter? Compare with training and print the fix.")
    build_command(doc, "live", DoctorLiveConfig, run_live,
                  "Send held-out prompts to a running engine; compare its per-position acceptance with eaglewire's prediction.")
    build_command(doc, "online", DoctorOnlineConfig, run_online,
                  "Run the engine on dataset prompts; compare the features the drafter gets with training, and online vs offline tau.")
    app.add_typer(doc, name="doctor")
