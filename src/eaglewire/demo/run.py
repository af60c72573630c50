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
from dataclasses import dataclass
from pathlib import Path

from eaglewire.demo.commands import demo_steps, print_commands
from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command, opt, save_config
from eaglewire.infra.output import emit, json_flag

PRESETS = {
    # ~15 minutes on the 2-core CPU machine: a small run, labelled as such in the report.
    "quick": dict(topic_prompts=640, self_prompts=0, prompt_tokens=48, max_new_tokens=128, gen_batch=64,
                  train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                  fc_norm=False, freeze_head=True, bench_prompts=9, bench_tokens=64, bench_repeats=1, heldout_tokens=128),
    # the recipe for the best tau this machine reaches in about 75 minutes.
    "standard": dict(topic_prompts=1700, self_prompts=0, prompt_tokens=64, max_new_tokens=160, gen_batch=64,
                     train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                     fc_norm=False, freeze_head=True, bench_prompts=18, bench_tokens=96, bench_repeats=1, heldout_tokens=128),
}


@dataclass
class DemoConfig:
    preset: str = opt("quick", "quick (~15 min on 2 CPU cores, a small run) or standard (about an hour on 2 CPU cores, the best tau here)")
    target: str = opt("default", "target (the embedded SmolLM2-135M-Instruct by default)")
    run_dir: Path | None = opt(None, "run directory (default: runs/demo-<preset>)")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    seed: int = opt(0, "seed for every stage")
    print_commands: bool = opt(False, "print the preset's stages as the eaglewire commands that run them, and exit "
                               "(the README's pipeline is this output)")
    json: bool = json_flag("print the summary as JSON")


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
    from eaglewire.data.pipeline import run_build

    c = _step(steps, "data build")
    return run_build(dataclasses.replace(c, resume=c.out.exists()))


def _train(steps: list) -> dict:
    from eaglewire.training.loop import run_train

    c = _step(steps, "train")
    return run_train(dataclasses.replace(c, resume=(c.out / "state").exists()))


def _doctor(cfg: DemoConfig, steps: list) -> dict:
    from eaglewire.demo.findings import demote
    from eaglewire.doctor.cli import trained_model_config
    from eaglewire.doctor.dataset import doctor_dataset
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.drafter.checkpoint import load_checkpoint
    from eaglewire.export.exporter import run_export
    from eaglewire.target.fingerprint import chat_template_hash
    from eaglewire.target.load import load_target

    t = load_target(cfg.target)
    dd, dr = _step(steps, "doctor dataset"), _step(steps, "doctor drafter")
    model, prov = load_checkpoint(dr.ckpt / "drafter")
    head = t.model.get_output_embeddings().weight.detach().float()
    reps = [doctor_dataset(dd.data, t, dd.samples), doctor_drafter(model, prov, dr.data, head, dr.samples, dr.depth)]
    arch = (t.config.architectures or [t.config.model_type])[0]
    exports = [s.config for s in steps if s.command == "export"]
    checks = [s.config for s in steps if s.command == "doctor config"]
    for ex, chk in zip(exports, checks):  # what a user deploys: the exports, checked against the training config
        run_export(dataclasses.replace(ex, force=ex.out.exists()))
        # the training config as `doctor config EXPORT` finds it: in the export's own record
        reps.append(doctor_config(chk.drafter_dir, chk.engine, t.num_layers, prov.point_names, prov.chat_template_sha,
                                  chat_template_hash(t.tokenizer), trained_model_config(chk.drafter_dir), arch))
    # a warning the demo's user cannot act on (its preset fixed the cause) is recorded as informational
    return {"reports": [demote(r.to_dict()) for r in reps]}


def _heldout(cfg: DemoConfig, steps: list) -> dict:
    """The number users judge a drafter by: acceptance on prompts it never saw, as vLLM counts it."""
    from eaglewire.data.pipeline import run_build
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.drafter.checkpoint import load_checkpoint
    from eaglewire.target.load import load_target

    build, dr = [s.config for s in steps if s.stage == "heldout"]
    run_build(dataclasses.replace(build, resume=build.out.exists()))
    t = load_target(cfg.target)
    model, prov = load_checkpoint(dr.ckpt / "drafter")
    head = t.model.get_output_embeddings().weight.detach().float()
    rep = doctor_drafter(model, prov, dr.data, head, dr.samples, dr.depth, t.tokenizer)
    return {"report": rep.to_dict()}


def _bench(steps: list) -> dict:
    from eaglewire.decoding.cli import bench_from_config

    return bench_from_config(_step(steps, "bench"))


def run_demo(cfg: DemoConfig) -> dict:
    from eaglewire.demo.report import write_report

    if cfg.preset not in PRESETS:
        raise EaglewireError(f"--preset {cfg.preset!r}: expected one of {', '.join(PRESETS)}")
    p = PRESETS[cfg.preset]
    run = cfg.run_dir or Path("runs") / f"demo-{cfg.preset}"
    if cfg.print_commands:
        text = print_commands(demo_steps(cfg.target, p, run, cfg.seed, cfg.device))
        print(text)
        return {"commands": text.splitlines()}
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "demo.config.json", {"preset_values": p})
    log: dict = {}
    steps = demo_steps(cfg.target, p, run, cfg.seed, cfg.device)
    _stage(run, "data", lambda: _data(steps), log)
    _stage(run, "train", lambda: _train(steps), log)
    _stage(run, "doctor", lambda: _doctor(cfg, steps), log)
    _stage(run, "heldout", lambda: _heldout(cfg, steps), log)
    _stage(run, "bench", lambda: _bench(steps), log)
    paths = write_report(run, cfg.preset, p, log)
    return {"run_dir": str(run), **paths, "summary": summary(log)}


def summary(log: dict) -> dict:
    b = log.get("bench", {})
    val = log.get("train", {}).get("validation", {})
    return {"val_acc": val.get("acc"), "methods": {name: {k: m.get(k) for k in ("tokens_per_s", "speedup", "speedup_vs_plain", "tau")}
                                                     for name, m in b.get("methods", {}).items()},
            "greedy_outputs_match": b.get("greedy_outputs_match"),
            "doctor_ok": all(r["ok"] for r in log.get("doctor", {}).get("reports", []))}


def _print_summary(res: dict) -> None:
    s = res["summary"]
    if res.get("verdict"):
        print(f"\n{res['verdict']}")
    print("\n method            tok/s  vs generate  vs plain   tau")
    for name, m in s["methods"].items():
        tau = f"{m['tau']:.2f}" if m.get("tau") else "-"
        vp = f"{m['speedup_vs_plain']:.2f}x" if m.get("speedup_vs_plain") else "-"
        print(f" {name:<16}{m['tokens_per_s']:>7.1f}{m['speedup']:>12.2f}x{vp:>10}{tau:>6}")
    print(f"\n doctor: {'all checks pass' if s['doctor_ok'] else 'PROBLEMS (see report)'}")
    print(f" report: {res['report_html']}\n         {res['report_md']}")


def register(app) -> None:
    def run(cfg: DemoConfig) -> None:
        if cfg.print_commands:  # printed by run_demo, one command per line (as JSON with --json)
            res = run_demo(dataclasses.replace(cfg, json=False)) if not cfg.json else None
            if cfg.json:
                import contextlib
                import io

                with contextlib.redirect_stdout(io.StringIO()):
                    res = run_demo(cfg)
                emit(res, True, print)
            return
        emit(run_demo(cfg), cfg.json, _print_summary)

    build_command(app, "demo", DemoConfig, run, "Run the whole pipeline on the default target and write report.html/report.md.")
