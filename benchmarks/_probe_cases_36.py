"""Issue 36 ("Hardening, third pass") for `probe_hardening.py`: paths that input names, custom model code,
a loopback capture server, help texts that render, and small bad values.

Names start with `i36-` (run them alone with `--only i36-`); `item` is the issue's item number.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _probe_cases import Case, need
from _probe_world import CLI_ENV, Res, World, prompts, write

VICTIM = "the user's file"


def _victim(d: Path, name: str = "victim.txt") -> Path:
    return write(d / name, VICTIM)


def _manifest_shard(w: World, d: Path, how: str) -> Path:
    """A copy of the tiny dataset whose first shard leads out of it (`..`, an absolute path or a symlink)."""
    data = w.copy(w.llama_ds, d / "data")
    victim = _victim(d)
    if how == "symlink":
        (data / "shard-00000.safetensors").unlink()
        (data / "shard-00000.safetensors").symlink_to(victim)
        return data
    raw = json.loads((data / "manifest.json").read_text())
    raw["shards"][0]["file"] = "../victim.txt" if how == "dotdot" else str(victim)
    write(data / "manifest.json", json.dumps(raw))
    return data


def _states_outside(w: World, d: Path) -> list:
    victim = write(d / "victim.safetensors", VICTIM)
    write(d / "victim.safetensors.lock", "")
    w.server.set("states-path")
    w.server.states_path = str(victim)
    data = w.copy(w.llama_answers, d / "data")
    return ["data", "extract", data, "--target", "tiny:llama", "--engine", "vllm", "--engine-url", w.server.url,
            "--device", "cpu"]


def _custom_code(w: World, d: Path) -> list:
    from eaglewire.targets.load import load_target

    t = w.copy(load_target("tiny:llama").path, d / "custom")
    cfg = json.loads((t / "config.json").read_text())
    write(t / "config.json", json.dumps({**cfg, "auto_map": {"AutoConfig": "evil.Thing"}}))
    write(t / "evil.py", f"open({str(d / 'RAN')!r}, 'w').write('x')\n")
    return ["inspect", "--target", t, "--device", "cpu"]


def _answer_yes(w: World, d: Path, args: list) -> Res:
    """`echo y | eaglewire ...`: transformers' [y/N] prompt for remote code would read this."""
    cmd = [sys.executable, "-m", "eaglewire.cli", *map(str, args)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, input="y\ny\n", capture_output=True, text=True, cwd=d, env=CLI_ENV, timeout=120)
        return Res(cmd, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    except subprocess.TimeoutExpired as e:
        return Res(cmd, None, str(e.stdout or ""), str(e.stderr or ""), time.monotonic() - t0, timed_out=True)


def _weight_map_outside(w: World, d: Path) -> list:
    src = w.copy(w.export("sglang"), d / "src")
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    shutil.move(src / "model.safetensors", d / "outside.safetensors")
    write(src / "model.safetensors.index.json", json.dumps({"weight_map": {k: "../outside.safetensors" for k in keys}}))
    return ["import", src, "--out", d / "imp", "--target-layers", 8]


def _extract_foreign(w: World, d: Path) -> list:
    data = w.copy(w.llama_answers, d / "data")
    write(data / "shard-00007.safetensors", VICTIM)  # named like a shard, listed by no manifest
    return ["data", "extract", data, "--device", "cpu"]


def _loopback(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
    need("--host 127.0.0.1" in res.stdout and "0.0.0.0" not in res.stdout, f"prints {res.stdout.strip()[:160]!r}")
    note = [ln for ln in res.stdout.splitlines() if ln.startswith("#")]
    need(note and "--host" in note[0], "no comment line says how to listen beyond loopback")
    return f"--host 127.0.0.1; {note[0][:70]}"


def _help(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0 and "Usage" in res.stdout, f"exit {res.rc}: {(res.stderr or res.stdout).strip()[-160:]}")
    return f"{len(res.stdout.splitlines())} lines of help"


def _not(path: str, what: str):
    return lambda res, w, d: need(not (d / path).exists(), what)


def issue36() -> list[Case]:
    build = ["data", "build", "--target", "tiny:llama", "--device", "cpu", "--max-new-tokens", 4, "--vocab-size", 50]
    in_out = lambda w, d: [*build, "--out", d / "out", "--prompts", prompts(d / "out" / "prompts.jsonl", 2)]  # noqa: E731
    foreign = lambda w, d: [*build, "--out", write(d / "out" / "shard-00000.safetensors", VICTIM).parent,  # noqa: E731
                            "--prompts", prompts(d / "p.jsonl", 2)]
    field = ("manifest.json", "shards[0].file")
    return [
        Case("i36-extract-resume-manifest-dotdot", 1, lambda w, d: ["data", "extract", _manifest_shard(w, d, "dotdot"),
                                                                    "--resume", "--device", "cpu"],
             words=field, protect=("victim.txt",)),
        Case("i36-build-resume-manifest-absolute", 1, lambda w, d: [*build, "--out", _manifest_shard(w, d, "absolute"),
                                                                    "--resume"], words=field, protect=("victim.txt",)),
        Case("i36-info-manifest-dotdot", 1, lambda w, d: ["data", "info", _manifest_shard(w, d, "dotdot")],
             words=field, protect=("victim.txt",)),
        Case("i36-extract-resume-shard-symlink-out", 1, lambda w, d: ["data", "extract", _manifest_shard(w, d, "symlink"),
                                                                      "--resume", "--device", "cpu"],
             words=field, protect=("victim.txt", "data/shard-00000.safetensors")),
        Case("i36-vllm-reply-path-outside-states-dir", 2, _states_outside, words=("hidden_states_path", "outside"),
             protect=("victim.safetensors", "victim.safetensors.lock"), strict=False, timeout=180),
        Case("i36-build-out-holds-the-prompts", 3, in_out, words=("--out", "--prompts"), protect=("out/prompts.jsonl",),
             post=_not("out/responses.jsonl", "answers were written")),
        Case("i36-build-out-holds-a-foreign-shard", 3, foreign, words=("shard-00000.safetensors",),
             protect=("out/shard-00000.safetensors",), post=_not("out/responses.jsonl", "answers were generated first")),
        Case("i36-extract-foreign-shard", 3, _extract_foreign, words=("shard-00007.safetensors",),
             protect=("data/shard-00007.safetensors",)),
        Case("i36-inspect-custom-code-answered-y", 4, _custom_code, run=_answer_yes,
             words=("custom", "auto_map", "never runs model code"), post=_not("RAN", "the model's code RAN")),
        Case("i36-import-weight-map-outside", 5, _weight_map_outside, words=("weight_map", "outside"),
             protect=("outside.safetensors",), post=_not("imp", "an eaglewire checkpoint was written anyway")),
        Case("i36-vllm-print-command-loopback", 6, lambda w, d: ["data", "extract", d / "data", "--target", "tiny:llama",
                                                                 "--engine", "vllm", "--print-command"], check=_loopback),
        Case("i36-help-data-build", 7, lambda w, d: ["data", "build", "--help"], check=_help),
        Case("i36-help-data-generate", 7, lambda w, d: ["data", "generate", "--help"], check=_help),
        Case("i36-generate-empty-prompts", 8, lambda w, d: ["data", "generate", "--target", "tiny:llama", "--device", "cpu",
                                                            "--out", d / "out", "--prompts", write(d / "p.jsonl", "")],
             words=("p.jsonl", "no prompts")),
        Case("i36-doctor-drafter-samples-0", 8, lambda w, d: ["doctor", "drafter", d, "--data", d, "--samples", 0],
             words=("--samples",)),
        Case("i36-doctor-drafter-samples-negative", 8, lambda w, d: ["doctor", "drafter", d, "--data", d, "--samples", -2],
             words=("--samples",)),
    ]
