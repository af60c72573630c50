"""The demo's presets and its options: every stage of the demo is built from these."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.options import opt
from eaglewire.infra.output import json_flag

PRESETS = {
    # ~15 minutes on the 2-core CPU machine: a small run, labelled as such in the report.
    # points: eagle3-deep moves EAGLE-3's last slot to the last layer's input, +0.022 held-out acceptance on
    # the quick preset (paired 95%: +0.004 to +0.040, docs/results.md); every engine serves it.
    "quick": dict(points="eagle3-deep", topic_prompts=640, self_prompts=0, prompt_tokens=48, max_new_tokens=128, gen_batch=64,
                  train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                  fc_norm=False, freeze_head=True, bench_prompts=9, bench_tokens=64, bench_repeats=1, heldout_tokens=128),
    # the recipe for the best tau this machine reaches in about 75 minutes.
    "standard": dict(points="eagle3-deep", topic_prompts=1700, self_prompts=0, prompt_tokens=64, max_new_tokens=160, gen_batch=64,
                     train_epochs=2, max_len=512, batch_size=2, lr=3e-3, ttt_steps=3, lk_weight=1.0, init="target",
                     fc_norm=False, freeze_head=True, bench_prompts=18, bench_tokens=96, bench_repeats=1, heldout_tokens=128),
}


@dataclass
class DemoConfig:
    preset: str = opt("quick", "quick (a small run: ~15 min on a fast 2-core VM, up to ~40 on a slow one) or standard "
                      "(about an hour on a fast 2-core VM, the best tau here)")
    target: str = opt("default", "target (the embedded SmolLM2-135M-Instruct by default)")
    run_dir: Path | None = opt(None, "run directory (default: runs/demo-<preset>)")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N")
    seed: int = opt(0, "seed for every stage")
    print_commands: bool = opt(False, "print the preset's stages as the eaglewire commands that run them, and exit "
                               "(the README's pipeline is this output)")
    json: bool = json_flag("print the summary as JSON")
