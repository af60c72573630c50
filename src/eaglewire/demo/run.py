"""`eaglewire demo`: the whole pipeline on the embedded default target, resumable stage by stage.

prompts (task types x topics) -> target answers -> features + draft vocab -> drafter
(TTT) -> doctor -> benchmark on held-out prompts -> report.html / report.md.
Each stage leaves a marker of completion in the run directory; an interrupted
demo re-run continues the unfinished stage (data and training resume) and
never redoes a finished one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.atomic import write_json_atomic
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command, opt, save_config
from eaglewire.infra.output import emit, json_flag

PRESETS = {
    # ~15 minutes on the 2-core CPU machine: a small run, labelled as such in the report.
    "quick": dict(topic_prompts=320, self_prompts=0, prompt_tokens=48, max_new_tokens=128, gen_batch=64,
                  train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                  fc_norm=False, freeze_head=True, bench_prompts=9, bench_tokens=64, bench_repeats=1),
    # the recipe for the best tau this machine reaches in about 75 minutes.
    "standard": dict(topic_prompts=1700, self_prompts=0, prompt_tokens=64, max_new_tokens=160, gen_batch=64,
                     train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                     fc_norm=False, freeze_head=True, bench_prompts=18, bench_tokens=96, bench_repeats=1),
}


@dataclass
class DemoConfig:
    preset: str = opt("quick", "quick (~15 min on 2 CPU cores, a small run) or standard (about an hour on 2 CPU cores, the best tau here)")
    target: str = opt("default", "target (the embedded SmolLM2-135M-Instruct by default)")
    run_dir: Path | None = opt(None, "run directory (default: runs/demo-<preset>)")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    seed: int = opt(0, "seed for every stage")
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


def _data(cfg: DemoConfig, p: dict, run: Path) -> dict:
    from eaglewire.data.options import DataBuildConfig
    from eaglewire.data.pipeline import run_build

    out = run / "data"
    return run_build(DataBuildConfig(out=out, target=cfg.target, topic_prompts=p["topic_prompts"], self_prompts=p["self_prompts"],
                                 self_prompt_tokens=p["prompt_tokens"], max_new_tokens=p["max_new_tokens"],
                                 batch_size=p["gen_batch"], seed=cfg.seed, device=cfg.device, resume=out.exists()))


def _train(cfg: DemoConfig, p: dict, run: Path) -> dict:
    from eaglewire.training.cli import TrainConfig
    from eaglewire.training.loop import run_train

    out = run / "train"
    return run_train(TrainConfig(data=run / "data", out=out, epochs=p["train_epochs"], batch_size=p["batch_size"],
                                 lr=p["lr"], seed=cfg.seed, max_len=p["max_len"], device=cfg.device, save_every=25, val_fraction=0.05,
                                 ttt_steps=p["ttt_steps"], lk_weight=p["lk_weight"], init=p["init"], fc_norm=p["fc_norm"], freeze_head=p["freeze_head"],
                                 resume=(out / "state").exists()))


def _doctor(cfg: DemoConfig, run: Path) -> dict:
    from eaglewire.doctor.cli import trained_model_config
    from eaglewire.doctor.dataset import doctor_dataset
    from eaglewire.doctor.drafter import doctor_drafter
    from eaglewire.doctor.engine_config import doctor_config
    from eaglewire.drafter.checkpoint import load_checkpoint
    from eaglewire.export.exporter import run_export
    from eaglewire.export.options import ExportConfig
    from eaglewire.target.fingerprint import chat_template_hash
    from eaglewire.target.load import load_target

    t = load_target(cfg.target)
    ck = run / "train" / "drafter"
    model, prov = load_checkpoint(ck)
    head = t.model.get_output_embeddings().weight.detach().float()
    reps = [doctor_dataset(run / "data", t), doctor_drafter(model, prov, run / "data", head, num_samples=128)]
    arch = (t.config.architectures or [t.config.model_type])[0]
    for fmt in ("sglang", "vllm"):  # what a user deploys: the exports, checked against the training config
        out = run / "export" / fmt
        run_export(ExportConfig(ckpt=ck, format=fmt, out=out, force=out.exists()))
        # the training config as `doctor config EXPORT` finds it: in the export's own record
        reps.append(doctor_config(out, fmt, t.num_layers, prov.point_names, prov.chat_template_sha,
                                  chat_template_hash(t.tokenizer), trained_model_config(out), arch))
    return {"reports": [r.to_dict() for r in reps]}


def _bench(cfg: DemoConfig, p: dict, run: Path) -> dict:
    from eaglewire.decoding.cli import BenchConfig, bench_from_config

    # the shipped held-out set (hand-written, never used to make training data), one category at a time
    return bench_from_config(BenchConfig(drafter=run / "train" / "drafter", target=cfg.target, max_prompts=p["bench_prompts"],
                                         repeats=p["bench_repeats"], max_new_tokens=p["bench_tokens"], out=run / "bench",
                                         device=cfg.device))


def run_demo(cfg: DemoConfig) -> dict:
    from eaglewire.demo.report import write_report

    if cfg.preset not in PRESETS:
        raise EaglewireError(f"--preset {cfg.preset!r}: expected one of {', '.join(PRESETS)}")
    p = PRESETS[cfg.preset]
    run = cfg.run_dir or Path("runs") / f"demo-{cfg.preset}"
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "demo.config.json", {"preset_values": p})
    log: dict = {}
    _stage(run, "data", lambda: _data(cfg, p, run), log)
    _stage(run, "train", lambda: _train(cfg, p, run), log)
    _stage(run, "doctor", lambda: _doctor(cfg, run), log)
    _stage(run, "bench", lambda: _bench(cfg, p, run), log)
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
    print("\n method            tok/s  vs generate  vs plain   tau")
    for name, m in s["methods"].items():
        tau = f"{m['tau']:.2f}" if m.get("tau") else "-"
        vp = f"{m['speedup_vs_plain']:.2f}x" if m.get("speedup_vs_plain") else "-"
        print(f" {name:<16}{m['tokens_per_s']:>7.1f}{m['speedup']:>12.2f}x{vp:>10}{tau:>6}")
    print(f"\n doctor: {'all checks pass' if s['doctor_ok'] else 'PROBLEMS (see report)'}")
    print(f" report: {res['report_html']}\n         {res['report_md']}")


def register(app) -> None:
    def run(cfg: DemoConfig) -> None:
        emit(run_demo(cfg), cfg.json, _print_summary)

    build_command(app, "demo", DemoConfig, run, "Run the whole pipeline on the default target and write report.html/report.md.")
