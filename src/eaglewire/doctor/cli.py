"""`eaglewire doctor {dataset,drafter,config,online,live}`: verdict table, --json, non-zero exit on problems."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from eaglewire.infra.options import build_command, opt
from eaglewire.infra.output import json_flag
from eaglewire.target.points import DEFAULT_ENGINE


@dataclass
class DoctorDatasetConfig:
    data: Path = opt(help="dataset directory (ours or imported)", arg=True)
    target: str = opt("", "target to recompute features with; default: the one in the manifest")
    samples: int = opt(4, "samples to check")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    json: bool = json_flag()


@dataclass
class DoctorDrafterConfig:
    ckpt: Path = opt(help="drafter checkpoint (eaglewire) or training run directory", arg=True)
    data: Path = opt(help="dataset captured at the drafter's points")
    target: str = opt("", "target (for its lm_head); default: the drafter's provenance")
    samples: int = opt(64, "samples to evaluate (from the held-out split when --data is the training dataset)")
    depth: int = opt(4, "chain depth of the offline mean acceptance length (4: eaglewire's chain default; for vLLM, "
                     "its num_speculative_tokens)", ge=1)
    json: bool = json_flag()


@dataclass
class DoctorEngineConfig:
    drafter_dir: Path = opt(help="the draft model directory as deployed (config.json + weights)", arg=True)
    engine: str = opt("", "engine that will serve it, optionally with its version: sglang, sglang==0.5.23, "
                      "vllm==0.32.0, speculators (no version: every known version is checked); default: the engine "
                      "the export was written for (its eaglewire.export.json); required for a directory made elsewhere")
    arch: str = opt("", "target architecture or model_type (SGLang >= 0.5.13 reads ids differently on DeepSeek-family "
                    "targets); default: from --target, else from the drafter's provenance")
    trained_on: Path | None = opt(None, "eaglewire checkpoint the drafter came from (default: eaglewire.json in the dir)")
    target: str = opt("", "serving target (gives L and the serving chat template)")
    target_layers: int = opt(0, "the target's decoder layer count when --target is not given",
                             aliases=("--num-layers",))
    json: bool = json_flag()


@dataclass
class DoctorOnlineConfig:
    drafter: Path = opt(help="drafter checkpoint or training run directory")
    data: Path = opt(help="dataset the drafter was trained on (its prompts and features are the reference)")
    target: str = opt("", "target; default: the drafter's provenance")
    serve_ids: list[int] = opt(help="simulate serving with these ids (in --engine's meaning) instead of the trained points", factory=list)
    engine: str = opt(DEFAULT_ENGINE, "meaning of --serve-ids: hf, sglang, specforge, vllm, speculators "
                      "(optionally ==VERSION)")
    samples: int = opt(4, "dataset samples to decode")
    max_new_tokens: int = opt(48, "tokens to decode per sample")
    json: bool = json_flag()


def run_dataset(cfg: DoctorDatasetConfig) -> None:
    from eaglewire.data.manifest import Manifest
    from eaglewire.doctor.dataset import doctor_dataset
    from eaglewire.infra.device import resolve_device
    from eaglewire.target.load import load_target

    man = Manifest.load(cfg.data)
    t = load_target(_target_source(cfg.target, man.target.source, cfg.data), device=resolve_device(cfg.device))
    rep = doctor_dataset(cfg.data, t, cfg.samples)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def run_drafter(cfg: DoctorDrafterConfig) -> None:
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.target.load import load_target

    model, prov = load_checkpoint(resolve_dir(cfg.ckpt))
    t = load_target(_target_source(cfg.target, prov.target.source, cfg.ckpt))
    head_w = t.model.get_output_embeddings().weight.detach().float()
    rep = doctor_drafter(model, prov, cfg.data, head_w, cfg.samples, cfg.depth, t.tokenizer)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def _target_source(given: str, recorded: str | None, artifact: Path) -> str:
    """--target, else the target the artifact records; never a silent default for a foreign one."""
    from eaglewire.infra.errors import EaglewireError

    if not (given or recorded):
        raise EaglewireError(f"{artifact}: records no target (made elsewhere): pass --target")
    return given or recorded


def run_config(cfg: DoctorEngineConfig) -> None:
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.drafter.checkpoint import resolve_dir
    from eaglewire.infra.errors import EaglewireError
    from eaglewire.target.fingerprint import chat_template_hash
    from eaglewire.target.load import load_target

    src = resolve_dir(cfg.trained_on) if cfg.trained_on else cfg.drafter_dir
    names, L, model_type, trained_sha = trained_wiring(src)
    L = cfg.target_layers or L
    arch = cfg.arch or model_type
    serving_sha = None
    if cfg.target:
        t = load_target(cfg.target)
        L, serving_sha = t.num_layers, chat_template_hash(t.tokenizer)
        arch = cfg.arch or (t.config.architectures or [t.config.model_type])[0]
    engine = cfg.engine or exported_for(cfg.drafter_dir)
    if not engine:  # the same ids mean other layers to another engine: never guess which one serves it
        raise EaglewireError(f"{cfg.drafter_dir}: records no export (no eaglewire.export.json): name the engine that will "
                             "serve it with --engine (sglang, sglang==VERSION, vllm, speculators, ...)")
    rep = doctor_config(cfg.drafter_dir, engine, L, names, trained_sha, serving_sha, trained_model_config(src), arch)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def exported_for(d: Path) -> str | None:
    """The engine an `eaglewire export` directory was written for (its record), so that checking it
    needs no --engine; None for anything else (a checkpoint, another tool's export)."""
    import json

    from eaglewire.doctor.engine_config import ENGINES
    from eaglewire.export.exporter import RECORD
    from eaglewire.export.formats import ID_ENGINE

    try:
        record = json.loads((Path(d) / RECORD).read_text())
        fmt, spec = record.get("format"), record.get("engine_spec")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(spec, str) and spec.partition("==")[0] in ENGINES:
        return spec  # with the version the ids were written for (older records name the format only)
    engine = ID_ENGINE.get(fmt) if isinstance(fmt, str) else None
    return engine if engine in ENGINES else None


def trained_wiring(src: Path) -> tuple[list[str] | None, int | None, str | None, str | None]:
    """(capture point names, target layers, target model_type, chat template hash) the drafter was
    trained with: from a checkpoint's provenance, or from the record an `eaglewire export` writes."""
    import json

    from eaglewire.drafter.checkpoint import read_provenance
    from eaglewire.drafter.provenance import FILE as PROVENANCE
    from eaglewire.export.exporter import RECORD
    from eaglewire.target.fingerprint import TargetFingerprint

    if (src / PROVENANCE).is_file():
        p = read_provenance(src)
        return p.point_names, p.num_layers, p.fingerprint.model_type, p.chat_template_sha
    if (src / RECORD).is_file():
        exp = json.loads((src / RECORD).read_text())
        fp = TargetFingerprint.from_json(exp.get("target_fingerprint"), f"{src / RECORD}: target_fingerprint")
        return exp.get("points"), exp.get("target_num_layers"), fp.model_type, exp.get("chat_template_sha")
    return None, None, None, None


def trained_model_config(src: Path) -> dict | None:
    """The draft layer's config at training time: in an eaglewire checkpoint, or recorded by the export.

    An export records it itself (older exports only name their source checkpoint, which may
    have moved): without it the rope/eps/norm rows cannot be checked at all.
    """
    import json

    from eaglewire.drafter.checkpoint import resolve_dir
    from eaglewire.export.formats import DRAFTER_KEY
    from eaglewire.infra.errors import EaglewireError

    candidates = [src / "eaglewire.export.json", src / "config.json"]
    try:
        source = json.loads(candidates[0].read_text()).get("source")
        if source:
            candidates.append(resolve_dir(Path(source)) / "config.json")
    except (EaglewireError, ValueError, OSError, AttributeError):
        pass  # no record, or the checkpoint it came from is gone: only what the export recorded is known
    for p in candidates:
        try:
            raw = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get(DRAFTER_KEY), dict):
            return raw[DRAFTER_KEY]
    return None


@dataclass
class DoctorLiveConfig:
    server: str = opt(help="URL of the running engine, e.g. http://127.0.0.1:8000 (vLLM)")
    drafter: Path = opt(help="the eaglewire checkpoint or training run the server's drafter was exported from")
    target: str = opt("", "the served target (same weights) for eaglewire's prediction; default: the drafter's provenance")
    served_drafter: Path | None = opt(None, "directory the server loaded as its drafter, checked on a FAIL; default: the "
                                      "export `eaglewire serve` recorded")
    prompts: Path | None = opt(None, "JSONL prompts; default: the shipped held-out set")
    num_prompts: int = opt(8, "prompts to send (round-robin over categories)", ge=1)
    max_new_tokens: int = opt(64, "tokens per prompt", ge=1)
    data: Path | None = opt(None, "for a target too big to run here: a dataset built from the prompts to send "
                            "(`data build --prompts`); its prompts are sent, and the prediction is the offline "
                            "acceptance on its stored features (an estimate: catches collapsed acceptance, not a "
                            "slightly shifted slot)")
    json: bool = json_flag()


def run_live(cfg: DoctorLiveConfig) -> None:
    if cfg.data is not None:
        return _run_live_offline(cfg)
    from eaglewire.decoding.cli import encode_prompt_file, heldout_prompts_path
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.doctor.live import doctor_live, static_check_for
    from eaglewire.drafter.checkpoint import read_provenance, resolve_dir
    from eaglewire.target.load import load_target

    ckpt = resolve_dir(cfg.drafter)
    t = load_target(_target_source(cfg.target, read_provenance(ckpt).target.source, cfg.drafter))
    drafter, points, _ = load_drafter_for(t, ckpt)
    engine = SpecEngine(t, drafter, points)
    prompts, _ = encode_prompt_file(engine, cfg.prompts or heldout_prompts_path(), cfg.num_prompts)
    arch = (t.config.architectures or [t.config.model_type])[0]
    static = static_check_for(cfg.served_drafter or _recorded_export(ckpt), [p.name for p in points], t.num_layers, arch)
    rep = doctor_live(cfg.server.rstrip("/"), engine, prompts, cfg.max_new_tokens, static)
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def _run_live_offline(cfg: DoctorLiveConfig) -> None:
    """No target in memory: its tokenizer renders the dataset's prompts, its lm_head (read alone) scores drafts."""
    from eaglewire.data.jsonl import read_jsonl, response_problem
    from eaglewire.data.lossmask import encode, render
    from eaglewire.data.options import RESPONSES
    from eaglewire.doctor.live import doctor_live, offline_acceptance, static_check_for
    from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.target.load import load_head_weight, load_tokenizer

    ckpt = resolve_dir(cfg.drafter)
    model, prov = load_checkpoint(ckpt)
    source = _target_source(cfg.target, prov.target.source, cfg.drafter)
    tok, head_w = load_tokenizer(source), load_head_weight(source)
    rows = sorted(read_jsonl(cfg.data / RESPONSES, check=response_problem), key=lambda r: r.get("index", 0))
    prompts = [encode(tok, render(tok, r["messages"][:-1], add_generation_prompt=True))
               for r in rows if r.get("messages")][: cfg.num_prompts]
    static = static_check_for(cfg.served_drafter or _recorded_export(ckpt), prov.point_names or [], prov.num_layers,
                              prov.fingerprint.model_type)
    rep = doctor_live(cfg.server.rstrip("/"), None, prompts, cfg.max_new_tokens, static,
                      offline=lambda depth: offline_acceptance(model, cfg.data, head_w, depth, 64))
    rep.print(cfg.json)
    raise typer.Exit(rep.exit_code())


def _recorded_export(ckpt: Path) -> Path | None:
    """The export `eaglewire serve` wrote for this checkpoint (what its server loaded), if any."""
    import json

    from eaglewire.serve.cli import RECORD

    rec = ckpt.parent / "serve" / RECORD
    try:
        return Path(json.loads(rec.read_text())["export"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_online(cfg: DoctorOnlineConfig) -> None:
    from eaglewire.doctor.inference import doctor_online
    from eaglewire.drafter.checkpoint import load_checkpoint, resolve_dir
    from eaglewire.target.load import load_target
    from eaglewire.target.points import points_from_ids

    model, prov = load_checkpoint(resolve_dir(cfg.drafter))
    t = load_target(_target_source(cfg.target, prov.target.source, cfg.drafter))
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
    build_command(doc, "live", DoctorLiveConfig, run_live,
                  "Send held-out prompts to a running engine; compare its per-position acceptance with eaglewire's prediction.")
    build_command(doc, "online", DoctorOnlineConfig, run_online,
                  "Run the engine on dataset prompts; compare the features the drafter gets with training, and online vs offline tau.")
    app.add_typer(doc, name="doctor")
