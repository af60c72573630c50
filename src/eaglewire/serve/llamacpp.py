"""`eaglewire serve --engine llama.cpp`: the drafter as GGUF next to a GGUF target, in llama-server, verified.

The same contract as the vLLM path (serving.py checks and holds both): the export writes the ids llama.cpp reads
for the recorded points, the exact server command is printed first, and
"ready" is said only after `doctor live` found llama.cpp's per-position
acceptance (its `--metrics` counters) equal to eaglewire's prediction.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from eaglewire.engines.llama_env import find_server
from eaglewire.engines.llama_server import LlamaServer, LlamaSpec, llama_command
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.export.gguf import GGUF_TYPES, checked_for_converter, target_gguf
from eaglewire.infra.errors import EaglewireError
from eaglewire.serve.config import ServeConfig
from eaglewire.serve.record import say, say_line, write_record
from eaglewire.targets.load import resolve_target_dir


def target_file(cfg: ServeConfig, source: str) -> Path:
    """--target-gguf as a file, or the target converted once to that type (cached)."""
    if cfg.target_gguf.lower() in (*GGUF_TYPES, "q4_1"):
        return target_gguf(source, cfg.target_gguf.lower())
    p = Path(cfg.target_gguf).expanduser()
    if not p.is_file():
        raise EaglewireError(f"--target-gguf {cfg.target_gguf}: neither a GGUF file nor one of "
                             f"{', '.join(GGUF_TYPES)} (a type the target is converted to)")
    return p


def spec_for(cfg: ServeConfig, target: Path, drafter: Path) -> LlamaSpec:
    return LlamaSpec(target_gguf=target, drafter_gguf=drafter, depth=cfg.depth, port=cfg.port, host=cfg.host,
                     ctx=cfg.max_model_len, threads=cfg.threads, p_min=cfg.p_min)


def print_llamacpp(cfg: ServeConfig, ckpt: Path, source: str, export_dir: Path) -> dict:
    """The two commands for the machine that will serve (nothing is built or converted here)."""
    export = (f"eaglewire export {shlex.quote(str(ckpt))} --format gguf --gguf-type {cfg.gguf_type} "
              f"--out {shlex.quote(str(export_dir))} --force")
    given = Path(cfg.target_gguf).expanduser()
    target = given if given.suffix == ".gguf" else Path(f"TARGET-{cfg.target_gguf}.gguf")
    if given.suffix != ".gguf":
        export += f" --target-gguf {cfg.target_gguf}"
        print(f"note: the target GGUF is written by the export (cached as <target>-{cfg.target_gguf}.gguf; its path is "
              "in the export's eaglewire.export.json as target_gguf); pass --target-gguf FILE to name yours",
              file=sys.stderr)
    cmd = llama_command("llama-server", spec_for(cfg, target, export_dir / "drafter.gguf"))
    return {"engine": "llama.cpp", "export_command": export, "command": shlex.join(cmd), "export": str(export_dir),
            "target": source, "depth": cfg.depth, "p_min": cfg.p_min}


def start_llamacpp(cfg: ServeConfig, ckpt: Path, source: str, out: Path) -> tuple[LlamaServer, dict, Path]:
    """Export, record and start: (the started server, the serve record, the export directory).

    The target is checked first: llama.cpp's converter reads it (the vocabulary, and the whole model when
    --target-gguf names a type) and would run code it names; nothing is built, converted or written before."""
    checked_for_converter(resolve_target_dir(source))
    binary = find_server(cfg.llama_server)
    say(cfg, f"[serve] the target as GGUF ({cfg.target_gguf}; converted once, then cached)")
    target = target_file(cfg, source)
    say(cfg, f"[serve] exporting the drafter as GGUF ({cfg.gguf_type}) into {out / 'llama.cpp'}")
    exp = run_export(ExportConfig(ckpt=ckpt, format="gguf", out=out / "llama.cpp", gguf_type=cfg.gguf_type,
                                  verifier=source, force=True))
    spec = spec_for(cfg, target, Path(exp["out"]).resolve() / "drafter.gguf")
    cmd = llama_command(binary, spec)
    log = out / "llama-server.log"
    res = {"url": spec.url, "command": shlex.join(cmd), "export": exp["out"], "ids": exp["ids"],
           "engine": exp["engine"], "target": source, "target_gguf": str(target), "log": str(log), "p_min": cfg.p_min,
           "depth": cfg.depth}
    write_record(out, res)
    print(f"[serve] {res['command']}", file=sys.stderr, flush=True)
    server = LlamaServer(binary, spec, log).start(timeout=cfg.startup_timeout, say=None if cfg.json else say_line)
    return server, res, Path(exp["out"])


def human(res: dict, rep) -> None:
    print(f"serving {res['target_gguf']} with drafter {res['export']} (eagle3.target_layers {res['ids']}, llama.cpp)")
    if rep is not None:
        s, p = rep.data["served"], rep.data["predicted"]
        gate = f" at --spec-draft-p-min {res['p_min']:g}" if res.get("p_min") else ""
        print(f"check: {rep.data['prompts']} held-out prompts{gate}, served mean acceptance length "
              f"{s['mean_acceptance_length']:.2f} = eaglewire's {p['mean_acceptance_length']:.2f}; "
              f"accepted per position {s['accepted_per_pos']} of {s['drafts']} rounds")
