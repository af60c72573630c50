"""`eaglewire doctor {dataset,drafter,config,online}`: verdict table, --json, non-zero exit on problems."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from eaglewire.infra.options import build_command, opt


@dataclass
class DoctorDatasetConfig:
    data: Path = opt(help="dataset directory (ours or imported)", arg=True)
    target: str = opt("", "target to recompute features with; default: the one in the manifest")
    samples: int = opt(4, "samples to check")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    json: bool = opt(False, "print JSON")


@dataclass
class DoctorDrafterConfig:
    ckpt: Path = opt(help="drafter checkpoint (eaglewire) or training run directory", arg=True)
    data: Path = opt(help="dataset captured at the drafter's points")
    target: str = opt("", "target (for its lm_head); default: the drafter's provenance")
    samples: int = opt(64, "samples to evaluate (from the held-out split when --data is the training dataset)")
    depth: int = opt(4, "chain depth for the offline tau (the serving chain default)")
    json: bool = opt(False, "print JSON")


@dataclass
class DoctorEngineConfig:
    drafter_dir: Path = opt(help="the draft model directory as deployed (config.json + weights)", arg=True)
    engine: str = opt("sglang", "engine that will serve it, optionally with its version: sglang, sglang==0.5.23, "
                      "vllm==0.32.0, speculators (no version: every known version is checked)")
    arch: str = opt("", "target architecture or model_type (SGLang >= 0.5.13 reads ids differently on DeepSeek-family "
                    "targets); default: from --target, else from the drafter's provenance")
    trained_on: Path | None = opt(None, "eaglewire checkpoint the drafter came from (default: eaglewire.json in the dir)")
    target: str = opt("", "serving target (gives L and the serving chat template)")
    num_layers: int = opt(0, "target layers, when --target is not given")
    json: bool = opt(False, "print JSON")


@dataclass
class DoctorOnlineConfig:
    drafter: Path = opt(help="drafter checkpoint or training run directory")
    data: Path = opt(help="dataset the drafter was trained on (its prompts and features are the reference)")
    target: str = opt("", "target; default: the drafter's provenance")
    serve_ids: list[int] = opt(help="simulate serving with these ids (in --engine's meaning) instead of the trained points", factory=list)
    engine: str = opt("vllm", "meaning of --serve-ids: hf, sglang, specforge, vllm, speculators (optionally ==VERSION)")
    samples: int = opt(4, "dataset samples to decode")
    max_new_tokens: int = opt(48, "tokens to decode per sample")
    json: bool = opt(False, "print JSON")


def run_dataset(cfg: DoctorDatasetConfig) -> None:
    from eaglewire.data.manifest import read_manifest
    from eaglewire.doctor.dataset import doctor_dataset
    from eaglewire.infra.device import resolve_device
    from eaglewire.target.load import load_target, recorded_source

    man = read_manifest(cfg.data)
    t = load_target(cfg.target or recorded_source(man["target"]), device=resolve_device(cfg.device))
    rep = doctor_dataset(cfg.data, t, cfg.samples)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_drafter(cfg: DoctorDrafterConfig) -> None:
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.target.load import load_target, recorded_source

    model, prov = load_checkpoint(resolve_dir(cfg.ckpt))
    t = load_target(cfg.target or recorded_source(prov["target"]))
    head_w = t.model.get_output_embeddings().weight.detach().float()
    rep = doctor_drafter(model, prov, cfg.data, head_w, cfg.samples, cfg.depth)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_config(cfg: DoctorEngineConfig) -> None:
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.drafter.checkpoint import read_provenance, resolve_dir
    from eaglewire.target.load import chat_template_hash, load_target

    prov = {}
    src = resolve_dir(cfg.trained_on) if cfg.trained_on else cfg.drafter_dir
    if (src / "eaglewire.json").is_file():
        prov = read_provenance(src)
    elif (src / "eaglewire.export.json").is_file():  # an `eaglewire export` directory records its points
        import json

        exp = json.loads((src / "eaglewire.export.json").read_text())
        prov = {"points": {"names": exp.get("points")}, "target_num_layers": exp.get("target_num_layers"),
                "target_fingerprint": exp.get("target_fingerprint")}
    L = cfg.num_layers or prov.get("target_num_layers")
    fp = prov.get("target_fingerprint")
    arch = cfg.arch or (fp.get("model_type") if isinstance(fp, dict) else None)
    serving_sha = None
    if cfg.target:
        t = load_target(cfg.target)
        L, serving_sha = t.num_layers, chat_template_hash(t.tokenizer)
        arch = cfg.arch or (t.config.architectures or [t.config.model_type])[0]
    rep = doctor_config(cfg.drafter_dir, cfg.engine, L, (prov.get("points") or {}).get("names"),
                        prov.get("chat_template_sha"), serving_sha, trained_model_config(src), arch)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def trained_model_config(src: Path) -> dict | None:
    """The draft layer's config at training time: in an eaglewire checkpoint, or in the one an export came from."""
    import json

    from eaglewire.drafter.checkpoint import resolve_dir
    from eaglewire.infra.errors import EaglewireError

    candidates = [src]
    record = src / "eaglewire.export.json"
    if record.is_file():
        try:
            candidates.append(resolve_dir(Path(json.loads(record.read_text()).get("source") or "")))
        except (EaglewireError, ValueError, OSError):
            pass  # the checkpoint it came from is gone: only what the export recorded is known
    for d in candidates:
        try:
            raw = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("eaglewire_drafter_config"), dict):
            return raw["eaglewire_drafter_config"]
    return None


def run_online(cfg: DoctorOnlineConfig) -> None:
    from eaglewire.doctor.inference import doctor_online
    from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.target.load import load_target, recorded_source
    from eaglewire.target.points import points_from_ids

    model, prov = load_checkpoint(resolve_dir(cfg.drafter))
    t = load_target(cfg.target or recorded_source(prov["target"]))
    arch = (t.config.architectures or [t.config.model_type])[0]
    serve = points_from_ids(cfg.serve_ids, cfg.engine, t.num_layers, arch) if cfg.serve_ids else None
    rep = doctor_online(t, model, prov, cfg.data, serve, cfg.samples, cfg.max_new_tokens)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def register(app: typer.Typer) -> None:
    doc = typer.Typer(no_args_is_help=True, help="Find hidden-state wiring bugs: dataset slots, drafter, deployment config, online.")
    build_command(doc, "dataset", DoctorDatasetConfig, run_dataset, "Identify which physical target tensor each stored feature slot holds.")
    build_command(doc, "drafter", DoctorDrafterConfig, run_drafter, "Standalone drafter test: acc per TTT step, offline chain tau, d2t convention.")
    build_command(doc, "config", DoctorEngineConfig, run_config, "Which tensors will this engine feed the drafter? Compare with training and print the fix.")
    build_command(doc, "online", DoctorOnlineConfig, run_online,
                  "Run the engine on dataset prompts; compare the features the drafter gets with training, and online vs offline tau.")
    app.add_typer(doc, name="doctor")
