"""`eaglewire demo`: the whole pipeline on the embedded default target, resumable stage by stage.

prompts (task types x topics) -> target answers -> features + draft vocab -> drafter
(TTT) -> doctor -> benchmark on held-out prompts -> report.html / report.md.
Each stage leaves a marker of completion in the run directory; an interrupted
demo re-run continues the unfinished stage (data and training resume) and
never redoes a finished one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from eaglewire.data.pipeline import run_build
from eaglewire.decoding.run import bench_from_config
from eaglewire.demo.commands import demo_steps, print_commands
from eaglewire.demo.config import PRESETS, DemoConfig
from eaglewire.demo.findings import demote
from eaglewire.demo.fit import fit_preset
from eaglewire.demo.llamacpp import NOT_BUILT, llamacpp_refusal, llamacpp_stage
from eaglewire.demo.report import write_report
from eaglewire.doctor.dataset import doctor_dataset
from eaglewire.doctor.drafter import doctor_drafter
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.doctor.records import trained_model_config
from eaglewire.engines import llama_env
from eaglewire.export.exporter import run_export
from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import dir_lock
from eaglewire.infra.options import save_config
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.targets.fingerprint import chat_template_hash
from eaglewire.targets.load import load_target
from eaglewire.training.loop import run_train


def _stage(run: Path, name: str, fn, log: dict):
    marker = run / "stages" / f"{name}.json"
    if marker.exists():
        log[name] = json.loads(marker.read_text())
        print(f"[demo] {name}: done earlier (kept)")
        return log[name]
    print(f"[demo] {name} ...", flush=True)
    t0 = time.perf_counter()
    res = fn()
    res = {"seconds": round(time.perf_counter() - t0, 1), **(res or {})}
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(marker, res)  # a torn marker would stop every later resume
    log[name] = res
    return res


def _step(steps: list, command: str):
    """The config of the first `command` in the demo's plan."""
    return next(s.config for s in steps if s.command == command)


def _data(steps: list) -> dict:
    c = _step(steps, "data build")
    return run_build(dataclasses.replace(c, resume=c.out.exists()))


def _train(steps: list) -> dict:
    c = _step(steps, "train")
    return run_train(dataclasses.replace(c, resume=(c.out / "state").exists()))


def _doctor(cfg: DemoConfig, steps: list) -> dict:
    t = load_target(cfg.target)
    dd, dr = _step(steps, "doctor dataset"), _step(steps, "doctor drafter")
    model, prov = load_checkpoint(dr.ckpt / "drafter")
    head = t.model.get_output_embeddings().weight.detach().float()
    reps = [doctor_dataset(dd.data, t, dd.samples), doctor_drafter(model, prov, dr.data, head, dr.samples, dr.depth)]
    arch = t.arch
    exports = [s.config for s in steps if s.command == "export"]
    checks = [s.config for s in steps if s.command == "doctor config"]
    refused = []
    for ex, chk in zip(exports, checks):  # what a user deploys: the exports, checked against the training config
        try:
            run_export(dataclasses.replace(ex, force=ex.out.exists()))
        except EaglewireError as e:  # an engine that cannot take this target: said in the report, the rest goes on
            refused.append({"format": ex.format, "engine": chk.engine, "refusal": str(e)})
            continue
        # the training config as `doctor config EXPORT` finds it: in the export's own record
        rep = doctor_config(chk.drafter_dir, chk.engine, t.num_layers, prov.point_names, prov.chat_template_sha,
                            chat_template_hash(t.tokenizer), trained_model_config(chk.drafter_dir), arch)
        rep.data["engine"] = chk.engine  # the report names each export's engine: two `config` rows read alike
        reps.append(rep)
    # a warning the demo's user cannot act on (its preset fixed the cause) is recorded as informational
    return {"reports": [demote(r.to_dict()) for r in reps], "refused": refused}


def _heldout(cfg: DemoConfig, steps: list) -> dict:
    """The number users judge a drafter by: acceptance on prompts it never saw, as vLLM counts it."""
    build, dr = [s.config for s in steps if s.stage == "heldout"]
    run_build(dataclasses.replace(build, resume=build.out.exists()))
    t = load_target(cfg.target)
    model, prov = load_checkpoint(dr.ckpt / "drafter")
    head = t.model.get_output_embeddings().weight.detach().float()
    rep = doctor_drafter(model, prov, dr.data, head, dr.samples, dr.depth, t.tokenizer)
    return {"report": rep.to_dict()}


def _bench(steps: list) -> dict:
    return bench_from_config(_step(steps, "bench"))


def run_demo(cfg: DemoConfig) -> dict:
    if cfg.preset not in PRESETS:
        raise EaglewireError(f"--preset {cfg.preset!r}: expected one of {', '.join(PRESETS)}")
    p, fitted = fit_preset(PRESETS[cfg.preset], cfg.target)
    run = cfg.run_dir or Path("runs") / f"demo-{cfg.preset}"
    if cfg.print_commands:
        text = print_commands(demo_steps(cfg.target, p, run, cfg.seed, cfg.device))
        print(text)
        return {"commands": text.splitlines()}
    with dir_lock(run, "demo"):  # a second demo on this directory is refused before it writes anything
        refuse_other_settings(cfg, run)
        save_config(cfg, run / DEMO_CONFIG, {"preset_values": p, "fitted_to_target": fitted})
        return _run_stages(cfg, p, run, fitted)


DEMO_CONFIG = "demo.config.json"
RECORDED = ("preset", "target", "seed")  # what the run directory's data, drafter and numbers depend on


def refuse_other_settings(cfg: DemoConfig, run: Path) -> None:
    """A demo rerun continues its directory only with the settings it was started with: another preset or
    target would put two runs' answers in one dataset and one report."""
    p = run / DEMO_CONFIG
    if not p.is_file():
        return
    try:
        raw = json.loads(p.read_text())
        old = raw["config"] if isinstance(raw, dict) and isinstance(raw.get("config"), dict) else None
    except (ValueError, RecursionError):
        old = None
    if old is None:
        raise EaglewireError(f"{p}: unreadable (it records the settings this demo directory was started with); "
                             "choose another --run-dir")
    diff = [f"--{k.replace('_', '-')} {getattr(cfg, k)!r} (recorded: {old.get(k)!r})" for k in RECORDED
            if k in old and old[k] != getattr(cfg, k)]
    if diff:
        raise EaglewireError(f"{p}: this demo directory was started with other settings: {', '.join(diff)}; rerun "
                             "with the recorded values to continue it, or choose another --run-dir")


def _run_stages(cfg: DemoConfig, p: dict, run: Path, fitted: list[str]) -> dict:
    log: dict = {"fitted": fitted}
    steps = demo_steps(cfg.target, p, run, cfg.seed, cfg.device)
    _stage(run, "data", lambda: _data(steps), log)
    _stage(run, "train", lambda: _train(steps), log)
    _stage(run, "doctor", lambda: _doctor(cfg, steps), log)
    _stage(run, "heldout", lambda: _heldout(cfg, steps), log)
    _stage(run, "bench", lambda: _bench(steps), log)
    if llama_env.is_built() or llamacpp_refusal(run):  # no marker while it cannot run: building llama-server
        # later, a rerun adds the stage; a target llama.cpp refuses is said whether or not it is built
        _stage(run, "llamacpp", lambda: llamacpp_stage(run, cfg.target, p["bench_prompts"], p["bench_tokens"]), log)
    else:
        log["llamacpp"] = {"skipped": NOT_BUILT}
    paths = write_report(run, cfg.preset, p, log)
    return {"run_dir": str(run), **paths, "summary": summary(log)}


def summary(log: dict) -> dict:
    b = log.get("bench", {})
    val = log.get("train", {}).get("validation", {})
    return {"val_acc": val.get("acc"), "methods": {name: {k: m.get(k) for k in ("tokens_per_s", "speedup", "speedup_vs_plain", "tau")}
                                                     for name, m in b.get("methods", {}).items()},
            "greedy_outputs_match": b.get("greedy_outputs_match"),
            "doctor_ok": all(r["ok"] for r in log.get("doctor", {}).get("reports", []))}


