"""The demo's stages as the commands a user would type: one list feeds both the run and `--print-commands`.

The demo builds each stage's config here and runs it in process; `eaglewire
demo --print-commands` prints the same configs as `eaglewire ...` lines, so the
README's pipeline (checked against this output by a test) is exactly what a
preset runs, defaults and all.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from eaglewire.data.config import DataBuildConfig
from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.config import BenchConfig
from eaglewire.demo.deploy import FORMATS
from eaglewire.doctor.config import DoctorDatasetConfig, DoctorDrafterConfig, DoctorEngineConfig
from eaglewire.export.config import ExportConfig
from eaglewire.infra.options import to_argv
from eaglewire.saved.depth import DEPTH
from eaglewire.training.config import TrainConfig


@dataclass
class Step:
    command: str  # e.g. "data build"
    config: object  # that command's config dataclass
    stage: str  # the demo stage that runs it
    always: tuple[str, ...] = ("target",)  # printed even at their default: the line says which target it runs on


def demo_steps(target: str, preset: dict, run: Path, seed: int = 0, device: str = "auto") -> list[Step]:
    p, data, train = preset, run / "data", run / "train"
    steps = [
        Step("data build", DataBuildConfig(out=data, target=target, points=_points(p), topic_prompts=p["topic_prompts"],
                                           self_prompts=p["self_prompts"],
                                           **({"self_prompt_tokens": p["prompt_tokens"]} if p["self_prompts"] else {}),
                                           max_new_tokens=p["max_new_tokens"], batch_size=p["gen_batch"], seed=seed,
                                           device=device), "data"),
        Step("train", TrainConfig(data=data, out=train, epochs=p["train_epochs"], batch_size=p["batch_size"], lr=p["lr"],
                                  seed=seed, max_len=p["max_len"], device=device, save_every=25, val_fraction=0.05,
                                  ttt_steps=p["ttt_steps"], lk_weight=p["lk_weight"], init=p["init"],
                                  fc_norm=p["fc_norm"], freeze_head=p["freeze_head"],
                                  feature_noise=p.get("feature_noise", 0.0)), "train"),
        Step("doctor dataset", DoctorDatasetConfig(data=data, device=device), "doctor"),
        Step("doctor drafter", DoctorDrafterConfig(ckpt=train, data=data, samples=128), "doctor"),
    ]
    for fmt in FORMATS:  # what a user deploys: the exports, checked against the training config
        out = run / "export" / fmt
        steps += [Step("export", ExportConfig(ckpt=train / "drafter", format=fmt, out=out), "doctor"),
                  Step("doctor config", DoctorEngineConfig(drafter_dir=out, engine=fmt, trained_on=train,
                                                           target=target), "doctor")]
    # acceptance as vLLM counts it (depth 3, ungated) on the target's answers to the shipped held-out prompts
    held = run / "heldout"
    steps += [Step("data build", DataBuildConfig(out=held, target=target, points=_points(p), prompts=heldout_arg(),
                                                 max_new_tokens=p["heldout_tokens"], batch_size=p["gen_batch"],
                                                 seed=seed, device=device), "heldout"),
              Step("doctor drafter", DoctorDrafterConfig(ckpt=train, data=held, samples=54, depth=DEPTH), "heldout")]
    # the shipped held-out set (hand-written, never used to make training data), one category at a time
    steps.append(Step("bench", BenchConfig(drafter=train / "drafter", target=target, max_prompts=p["bench_prompts"],
                                           repeats=p["bench_repeats"], max_new_tokens=p["bench_tokens"],
                                           out=run / "bench", device=device), "bench"))
    return steps


def _points(preset: dict) -> list[str]:
    """The preset's capture points as a named set, so one preset fits a target of any depth."""
    return [preset["points"]] if preset.get("points") else []


def heldout_arg() -> Path:
    """The shipped held-out prompts, relative to the working directory when reachable from it (the README's form)."""
    path = heldout_prompts_path()
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def command_line(step: Step) -> str:
    keep = tuple(a for a in step.always if hasattr(step.config, a))
    return shlex.join(["eaglewire", *step.command.split(), *to_argv(step.config, keep)])


def print_commands(steps: list[Step]) -> str:
    return "\n".join(command_line(s) for s in steps)
