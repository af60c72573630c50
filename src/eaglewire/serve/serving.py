"""`eaglewire serve`: a trained run to a verified vLLM (or llama.cpp: serve/llamacpp.py) server in one command.

Exports the drafter with the ids its provenance implies for the vLLM version
that will serve it, starts vLLM's OpenAI-compatible server with the matching
speculative config, and says "ready" only after `doctor live` found the served
acceptance equal to eaglewire's prediction on a few held-out prompts. The
exact engine command is printed first, so it can be copied to a GPU box.
A DFlash checkpoint takes the same path with vLLM's `dflash` method and a
block-decoding prediction (serve/dflash.py); a P-EAGLE one vLLM's `eagle3`
with `parallel_drafting` and a parallel-decoding prediction (serve/peagle.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import torch

from eaglewire.doctor.commands import fitting_prompts, live_check
from eaglewire.engines.sglang import launch_line
from eaglewire.engines.vllm_env import find_python, vllm_version
from eaglewire.engines.vllm_server import ServeSpec, VllmServer, engine_command, serve_command
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.output import emit
from eaglewire.saved.checkpoint import read_provenance, resolve_dir
from eaglewire.saved.depth import DEPTH
from eaglewire.serve import dflash, llamacpp, peagle
from eaglewire.serve.config import ServeConfig
from eaglewire.serve.fit import read_target_config, refuse_misfit, tensor_parallel
from eaglewire.serve.record import say, say_line, write_record
from eaglewire.targets.codecheck import refuse_foreign_code
from eaglewire.targets.load import resolve_target_dir

__all__ = ["fitting_prompts", "run_serve"]  # fitting_prompts: serve's check keeps the prompts its server can answer


def _python(cfg: ServeConfig):
    py = find_python(cfg.vllm_python)
    return py, vllm_version(py)


def _export(cfg: ServeConfig, ckpt: Path, out: Path, version: str | None) -> dict:
    return run_export(ExportConfig(ckpt=ckpt, format="vllm", out=out / "vllm", engine_version=version or "", force=True))


def _spec(cfg: ServeConfig, target_dir: Path, export_dir: Path, device_type: str, depth: int, method: str,
          parallel: bool = False):
    dtype = cfg.dtype if cfg.dtype != "auto" else ("float32" if device_type == "cpu" else "auto")
    mem = cfg.memory_fraction or (0.3 if device_type == "cpu" else 0.0)
    return ServeSpec(target_dir=target_dir, drafter_dir=export_dir, depth=depth, method=method, port=cfg.port,
                     host=cfg.host, dtype=dtype, max_model_len=cfg.max_model_len, memory_fraction=mem,
                     parallel_drafting=parallel)


def _kind(cfg: ServeConfig, ckpt: Path) -> tuple[int, str]:
    """(drafts per round, vLLM's speculative method): a DFlash drafter drafts its block's slots."""
    if dflash.is_dflash_checkpoint(ckpt):
        return dflash.dflash_depth(cfg.depth, dflash.block_size(ckpt)), dflash.METHOD
    if peagle.is_peagle_checkpoint(ckpt):  # eagle3 with parallel_drafting (ServeSpec), K its trained depths
        return peagle.peagle_depth(cfg.depth, ckpt), "eagle3"
    return cfg.depth, "eagle3"


def _served_target(source: str) -> str:
    """The target as another machine's engine names it: a hub id or path as recorded; eaglewire's own
    names (`default`, `tiny:*`) only exist here, so their converted directory is printed instead."""
    if source == "default" or source.startswith("tiny:"):
        where = resolve_target_dir(source)
        print(f"note: target {source!r} is eaglewire's own name; the command loads its converted copy {where} "
              "(copy it along, or pass --target with the model as the serving machine loads it)", file=sys.stderr)
        return str(where)
    return source


def _fitted_tp(cfg: ServeConfig, ckpt: Path, source: str, prov) -> tuple[int, str]:
    """The drafter refused for a target of another shape; the tensor-parallel size the target needs."""
    raw = read_target_config(source)
    if raw is None:
        return cfg.tp or 1, "--tp" if cfg.tp else "not sized (the target's config is not here)"
    refuse_misfit(prov, ckpt, source, raw)
    return tensor_parallel(source, cfg.tp, cfg.gpu)


def print_commands(cfg: ServeConfig, ckpt: Path, source: str, prov) -> dict:
    """The export and the engine command for the machine that will serve: run there, in this order.

    Nothing is written and no engine is looked for here (this may be a laptop printing for a GPU
    box); the engine's own dtype and memory defaults apply unless the user set them."""
    out = cfg.out or ckpt.parent / "serve"
    export_dir = out / cfg.engine
    tp, tp_how = _fitted_tp(cfg, ckpt, source, prov)
    depth, method = _kind(cfg, ckpt)
    parallel = peagle.is_peagle_checkpoint(ckpt)
    if parallel:
        peagle.refuse_engine(cfg.engine, ckpt)
    version = f" --engine-version {shlex.quote(cfg.engine_version)}" if cfg.engine_version else ""
    export = (f"eaglewire export {shlex.quote(str(ckpt))} --format {cfg.engine}{version} "
              f"--out {shlex.quote(str(export_dir))} --force")
    target = _served_target(source)
    if cfg.engine == "sglang" and method == dflash.METHOD:
        engine = dflash.sglang_command(target, export_dir, depth, host=cfg.host, port=cfg.port, tp=tp)
    elif cfg.engine == "sglang":
        engine = launch_line(target, export_dir, depth, host=cfg.host, port=cfg.port, tp=tp)
    else:
        spec = ServeSpec(target_dir=Path(target), drafter_dir=export_dir, depth=depth, method=method, port=cfg.port,
                         host=cfg.host, dtype="" if cfg.dtype == "auto" else cfg.dtype,
                         max_model_len=cfg.max_model_len, memory_fraction=cfg.memory_fraction,
                         parallel_drafting=parallel, extra=["--tensor-parallel-size", str(tp)] if tp > 1 else [])
        engine = shlex.join(serve_command(spec))
    if tp > 1:
        print(f"note: tensor-parallel size {tp}: {tp_how}", file=sys.stderr)
    return {"engine": cfg.engine, "export_command": export, "command": engine, "export": str(export_dir),
            "target": source, "depth": depth, "method": method, "tensor_parallel_size": tp,
            "tensor_parallel_from": tp_how}


def run_serve(cfg: ServeConfig) -> dict:
    ckpt = resolve_dir(cfg.drafter)
    if not cfg.depth and not dflash.is_dflash_checkpoint(ckpt) and not peagle.is_peagle_checkpoint(ckpt):
        # the DFlash block and the P-EAGLE depths resolve their own (_kind)
        cfg = dataclasses.replace(cfg, depth=DEPTH)
    prov = read_provenance(ckpt)
    source = cfg.target or prov.target.source
    if not source:
        raise EaglewireError(f"{ckpt}: records no target (imported): pass --target")
    if cfg.engine == "llama.cpp" and dflash.is_dflash_checkpoint(ckpt):
        dflash.refuse_engine(cfg.engine, ckpt)
    if cfg.engine == "llama.cpp" and peagle.is_peagle_checkpoint(ckpt):
        peagle.refuse_engine(cfg.engine, ckpt)
    if cfg.engine == "llama.cpp":
        out = cfg.out or ckpt.parent / "serve"
        if cfg.print_command:
            raw = read_target_config(source)
            if raw is not None:
                refuse_misfit(prov, ckpt, source, raw)
            res = llamacpp.print_llamacpp(cfg, ckpt, source, out / "llama.cpp")
            emit(res, cfg.json, lambda r: print(f"{r['export_command']}\n{r['command']}"))
            return res
        server, res, export_dir = llamacpp.start_llamacpp(cfg, ckpt, source, out)
        return _check_and_hold(cfg, ckpt, source, server, res, export_dir, llamacpp.human,
                               "llama-server: OpenAI-compatible /v1 and /completion")
    if cfg.print_command:
        res = print_commands(cfg, ckpt, source, prov)
        emit(res, cfg.json, lambda r: print(f"{r['export_command']}\n{r['command']}"))
        return res
    if cfg.engine != "vllm" and dflash.is_dflash_checkpoint(ckpt):
        dflash.refuse_engine(cfg.engine, ckpt)
    if peagle.is_peagle_checkpoint(ckpt):
        peagle.refuse_engine(cfg.engine, ckpt)
    if cfg.engine != "vllm":
        raise EaglewireError(f"--engine {cfg.engine}: eaglewire starts and checks vLLM and llama.cpp; --print-command prints "
                             f"the {cfg.engine} command for the machine that will serve")
    out = cfg.out or ckpt.parent / "serve"
    refuse_foreign_code(resolve_target_dir(source), "vLLM", strict=False)  # vLLM implements native families itself
    depth, method = _kind(cfg, ckpt)  # first: a --depth the block cannot draft looks for nothing, writes nothing
    py, version = _python(cfg)
    say(cfg, f"[serve] exporting the drafter for {version or 'vLLM'} into {out / 'vllm'}")
    exp = _export(cfg, ckpt, out, version)
    spec = _spec(cfg, resolve_target_dir(source), Path(exp["out"]).resolve(), "cuda" if torch.cuda.is_available() else "cpu",
                 depth, method, peagle.is_peagle_checkpoint(ckpt))
    cmd = engine_command(py, spec)
    res = {"url": spec.url, "command": shlex.join(cmd), "export": exp["out"], "ids": exp["ids"], "engine": exp["engine"],
           "target": source, "log": str(out / "vllm.log"), "depth": depth, "method": method}
    write_record(out, res)
    print(f"[serve] {res['command']}", file=sys.stderr, flush=True)
    server = VllmServer(py, spec, out / "vllm.log")
    server.start(timeout=cfg.startup_timeout, say=None if cfg.json else say_line)
    return _check_and_hold(cfg, ckpt, source, server, res, Path(exp["out"]), _human, "OpenAI-compatible")


def _check_and_hold(cfg: ServeConfig, ckpt: Path, source: str, server, res: dict, export_dir: Path, human,
                    what: str) -> dict:
    """`doctor live` against the started server; "ready" only when it passed, then serve until Ctrl-C."""
    url = server.spec.url
    try:
        rep = _check(cfg, ckpt, source, url, export_dir)
        res["check"] = rep.to_dict() if rep else None
        if rep is not None and rep.failed:
            rep.print(cfg.json)
            raise EaglewireError(f"{url}: {failure_line(rep)}; server stopped")
        emit(res, cfg.json, lambda r: human(r, rep))
        if cfg.check_only:
            return res
        print(f"ready: {url} ({what}; Ctrl-C stops)", flush=True)
        server.proc.wait()
        raise EaglewireError(f"{server.name} exited ({server.proc.returncode}); log {server.log}: {server.log_tail()}")
    except KeyboardInterrupt:  # how a server is stopped: said here, so the CLI's generic interrupt line is not
        server.stop()
        print(f"stopped: {server.name} at {url} (Ctrl-C); the export and serve.json are kept (run `eaglewire serve` "
              "again to serve)", file=sys.stderr, flush=True)
        return res
    finally:
        server.stop()


def _check(cfg: ServeConfig, ckpt: Path, source: str, url: str, export_dir: Path):
    """`doctor live` itself (one function for both), on held-out prompts the server can answer whole."""
    if cfg.check_prompts == 0:
        return None
    say(cfg, f"[serve] checking {url} before 'ready': {cfg.check_prompts} held-out prompts, served against predicted")
    # one check for every drafter kind: doctor live predicts a DFlash block, a P-EAGLE parallel draft or a chain
    return live_check(url, ckpt, source, prompts=None, num_prompts=cfg.check_prompts, max_new_tokens=cfg.max_new_tokens,
                      served_drafter=export_dir, p_min=cfg.p_min if cfg.engine == "llama.cpp" else 0.0,
                      max_model_len=cfg.max_model_len, quiet=cfg.json)


def failure_line(rep) -> str:
    """What a failed live check found: nothing drafted (nothing compared), or acceptance that differs."""
    bad = [c for c in rep.checks if not c.ok and c.level == "error"]
    nothing = next((c for c in bad if c.name == "speculation"), None)
    if nothing is not None:
        return f"nothing compared: {nothing.detail}" + (f" ({nothing.fix})" if nothing.fix else "")
    return "the served acceptance differs from eaglewire's (table above)"


def _human(res: dict, rep) -> None:
    print(f"serving {res['target']} with drafter {res['export']} (ids {res['ids']}, {res['engine']})")
    if rep is not None:
        s, p = rep.data["served"], rep.data["predicted"]
        print(f"check: {rep.data['prompts']} held-out prompts, served mean acceptance length "
              f"{s['mean_acceptance_length']:.2f} = eaglewire's {p['mean_acceptance_length']:.2f}; "
              f"accepted per position {s['accepted_per_pos']} of {s['drafts']} rounds")
