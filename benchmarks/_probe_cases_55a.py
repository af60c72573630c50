"""Issue 55 ("Hardening, fourth pass"), first part, for `probe_hardening.py`: sequences, not single files. A
training run is killed (for real, or stopped after its last save), its dataset rebuilt at the same path from
another target or with other points, or named by the same relative path from another directory, and the run
resumed: expected, one `error:` line naming what differs, the run left as it was. The same dataset moved,
copied or named from another directory: expected, the run finishes. Also `data import` of two files with
one sample number or token ids outside the target's vocabulary, and `train` sizes past their bounds
(issue 58's size item).

Names start with `i55-` (`--only i55-`); `item` is 1 (the resume identity), 2 (records read back: imports),
3 (sizes).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from _probe_cases import Case, need
from _probe_world import CLI_ENV, Res, World, cli
from safetensors.torch import save_file

VOCAB = 100  # World.llama_ds's draft vocab size: every dataset here has it, so a resumed state loads
STEPS = 6  # a killed run is killed after its first save; every run here resumes with the options it started with
RESUME = ["--device", "cpu", "--max-steps", STEPS, "--save-every", 1, "--resume"]


def _once(w: World, key: str, build) -> Path:
    c = w.__dict__.setdefault("_i55", {})
    if key not in c:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            c[key] = build()
    return c[key]


def _qwen_ds(w: World) -> Path:
    """A dataset of tiny:qwen3 shaped as World.llama_ds (hidden 64, draft vocab 100): only the target differs."""
    def build() -> Path:
        from eaglewire_testing.tinydata import build_tiny_dataset

        (w.tmp / "i55-qwen").mkdir()
        return build_tiny_dataset(w.tmp / "i55-qwen", arch="qwen3", n=8, max_new_tokens=8, vocab_size=VOCAB,
                                  store_dtype="fp32")
    return _once(w, "qwen", build)


def _deep_ds(w: World) -> Path:
    """World.llama_ds's answers extracted at eagle3-deep (layers 1, 3, 6 where eagle3 is 1, 3, 4)."""
    def build() -> Path:
        from eaglewire.data.config import DataExtractConfig, DataVocabConfig
        from eaglewire.data.pipeline import run_extract, run_vocab

        d = w.tmp / "i55-deep"
        d.mkdir()
        for f in ("prompts.jsonl", "responses.jsonl", "generate.config.json"):
            shutil.copy2(w.llama_ds / f, d / f)
        run_extract(DataExtractConfig(data=d, target="tiny:llama", store_dtype="fp32", device="cpu",
                                      points=["eagle3-deep"]))
        run_vocab(DataVocabConfig(data=d, vocab_size=VOCAB))
        return d
    return _once(w, "deep", build)


def _stopped(data: Path, out: Path) -> Path:
    """A run on `data` stopped after its last save (drafter/ not written), as World.killed_run."""
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run_train(TrainConfig(data=data, out=out, device="cpu", max_steps=STEPS, save_every=1))
    shutil.rmtree(out / "drafter")
    return out


def _killed(data: Path, out: Path, cwd: Path) -> Path:
    """`eaglewire train` killed with SIGKILL once it saved a state (steps slowed so it is mid-run)."""
    cmd = [sys.executable, "-m", "eaglewire.cli", "train", "--data", str(data), "--out", str(out), "--device", "cpu",
           "--max-steps", str(STEPS), "--save-every", "1"]
    p = subprocess.Popen(cmd, cwd=cwd, env={**CLI_ENV, "EAGLEWIRE_STEP_DELAY": "2"}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while not (out / "state" / "meta.json").is_file() and p.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    if not (out / "state" / "meta.json").is_file() or (out / "drafter").exists():
        raise RuntimeError(f"the run was not killed mid-way (exit {p.returncode})")
    return out


def _rebuild(src: Path, at: Path) -> None:
    shutil.rmtree(at)
    shutil.copytree(src, at)


def _finished(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
    need((d / "run" / "drafter").is_dir(), "no run/drafter")
    return "resumed: run/drafter written"


def _in(cwd_rel: str):
    """Run the CLI from d/`cwd_rel` (a relative --data means something else there)."""
    def run(w: World, d: Path, args: list) -> Res:
        return cli(args, d / cwd_rel, 180)
    return run


def _resume_cases() -> list[Case]:
    def other_target(w: World, d: Path) -> list:
        data = w.copy(w.llama_ds, d / "ds")
        _killed(data, d / "run", d)
        _rebuild(_qwen_ds(w), data)
        return ["train", "--data", data, "--out", d / "run", *RESUME]

    def other_points(w: World, d: Path) -> list:
        data = w.copy(w.llama_ds, d / "ds")
        _stopped(data, d / "run")
        _rebuild(_deep_ds(w), data)
        return ["train", "--data", data, "--out", d / "run", *RESUME]

    def other_cwd(w: World, d: Path) -> list:
        for side in ("a", "b"):
            (d / side / "w1" / "w2").mkdir(parents=True)
        w.copy(w.llama_ds, d / "a" / "base")
        w.copy(_deep_ds(w), d / "b" / "base")
        _killed(Path("../../base"), d / "run", d / "a" / "w1" / "w2")
        return ["train", "--data", "../../base", "--out", d / "run", *RESUME]

    def same_from_elsewhere(w: World, d: Path) -> list:  # recorded relative, resumed from another directory
        (d / "a").mkdir()
        (d / "elsewhere").mkdir()
        w.copy(w.llama_ds, d / "a" / "base")
        _killed(Path("base"), d / "run", d / "a")
        return ["train", "--data", "../a/base", "--out", d / "run", *RESUME]

    def moved(w: World, d: Path) -> list:
        _stopped(w.copy(w.llama_ds, d / "ds"), d / "run")
        shutil.move(d / "ds", d / "moved")
        return ["train", "--data", d / "moved", "--out", d / "run", *RESUME]

    def copied(w: World, d: Path) -> list:
        _killed(w.copy(w.llama_ds, d / "ds"), d / "run", d)
        return ["train", "--data", w.copy(d / "ds", d / "copy"), "--out", d / "run", *RESUME]

    differs = ("not the dataset the run",)
    return [
        Case("i55-resume-killed-rebuilt-other-target", 1, other_target, words=(*differs, "target fingerprint"),
             protect=("run",), timeout=180),
        Case("i55-resume-rebuilt-other-points", 1, other_points, words=(*differs, "points"), protect=("run",),
             timeout=180),
        Case("i55-resume-same-relative-path-other-cwd", 1, other_cwd, words=(*differs, "points"), protect=("run",),
             run=_in("b/w1/w2"), timeout=180),
        Case("i55-resume-same-dataset-from-another-cwd", 1, same_from_elsewhere, check=_finished,
             protect=("a/base",), run=_in("elsewhere"), timeout=180),
        Case("i55-resume-moved-dataset", 1, moved, check=_finished, protect=("moved",), timeout=180),
        Case("i55-resume-killed-copied-dataset", 1, copied, check=_finished, protect=("copy",), timeout=180),
    ]


def _hs(path: Path, ids: list[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"hidden_states": torch.randn(len(ids), 4, 64), "token_ids": torch.tensor(ids)}, str(path))
    return path


def _import_cases() -> list[Case]:
    def dup(names: tuple[str, str]):
        def prep(w: World, d: Path) -> list:
            for n in names:
                _hs(d / "sp" / n, [1, 2, 3])
            return ["data", "import", d / "sp", "--out", d / "ds", "--all-loss", "--target-layers", 8]
        return prep

    def out_of_vocab(bad: int):
        def prep(w: World, d: Path) -> list:
            _hs(d / "sp" / "hidden_states" / "hs_0.safetensors", [1, bad, 3])
            return ["data", "import", d / "sp", "--out", d / "ds", "--all-loss", "--target", "tiny:llama"]
        return prep

    return [
        Case("i55-import-same-index-two-folders", 2, dup(("hidden_states/hs_0.safetensors", "hs_0.safetensors")),
             words=("hs_0.safetensors", "both are sample 0"), protect=("sp",)),
        Case("i55-import-same-index-zero-padded", 2, dup(("hidden_states/hs_1.safetensors",
                                                           "hidden_states/hs_01.safetensors")),
             words=("hs_01.safetensors", "both are sample 1"), protect=("sp",)),
        Case("i55-import-token-id-1e6", 2, out_of_vocab(1_000_000),
             words=("hs_0.safetensors", "token id 1000000", "[0, 384)"), protect=("sp",)),
        Case("i55-import-token-id-negative", 2, out_of_vocab(-5), words=("hs_0.safetensors", "token id -5"),
             protect=("sp",)),
    ]


def _size_cases() -> list[Case]:
    def train(flag: str, value: int):
        return lambda w, d: ["train", "--data", w.llama_ds, "--out", d / "run", "--device", "cpu", flag, value]

    sizes = (("--num-layers", 100000), ("--intermediate-size", 10**9), ("--ttt-steps", 10**6), ("--seed", 10**30))
    return [Case(f"i55-train{flag[1:]}-{value:.0e}".replace("+", ""), 3, train(flag, value), words=(flag, "<="),
                 mem_gib=8) for flag, value in sizes]


def issue55a() -> list[Case]:
    return [*_resume_cases(), *_import_cases(), *_size_cases()]
