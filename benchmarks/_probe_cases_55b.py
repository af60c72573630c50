"""Issue 55 (fourth pass), second part, for `probe_hardening.py`: `doctor live` against servers whose counters
are impossible (llama-server's and vLLM's), that trickle their completions (one deadline for the whole check),
or whose llama-server /props is broken (issue 58); a cached kernel cut short; deeply nested JSON in `--prompts`
and `plan --model-config`.

Names start with `i55-` (run them alone with `--only i55-`); `item` numbers the brief's items: 1 counters, 2 the
deadline, 3 /props, 4 the kernel cache, 6 deep JSON (5, a full disk in `gencapture.write`, is a test:
tests/data/test_gencapture_disk_full.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _probe_cases import Case, need
from _probe_world import CLI_ENV, Res, World, write

DEEP = 100_000


def _live(llama: bool | None = None, args: tuple = (), **server):
    """`doctor live` of the tiny drafter against a fake server: vLLM's routes, or llama-server's (`llama=True`),
    or vLLM's with fake_llama's trickle (`llama=False`)."""
    llama_kw = {k: server.pop(k) for k in ("props", "props_bytes", "props_stall_s", "trickle_s") if k in server}

    def prep(w: World, d: Path) -> list:
        from eaglewire_testing.fake_llama import llama_like
        from eaglewire_testing.fake_vllm import models

        srv = w.vllm(**{"served": models("tiny:llama"), **server})
        if llama is not None:
            llama_like(srv, llama=llama, **llama_kw)
        return ["doctor", "live", "--server", srv.url, "--drafter", w.drafter, "--num-prompts", 2,
                "--max-new-tokens", 4, *args]
    return prep


def _server_blamed(words: str):
    def check(res: Res, w: World, d: Path) -> str:
        row = next((ln.strip() for ln in res.stdout.splitlines() if "server counters" in ln), "")
        need(res.rc == 1 and row.startswith("FAIL") and words in row, f"exit {res.rc}; no FAIL row naming the "
             f"server's counters ({words!r}): {res.stdout.strip().splitlines()[-3:]}")
        need("not of the drafter's wiring" in res.stdout, "the FAIL row does not clear the wiring")
        positions = [ln for ln in res.stdout.splitlines() if ln.strip()[4:].strip().startswith("position ")]
        need(not positions, f"per-position rows were still compared: {positions[:1]}")
        return row
    return check


def _counters(drafts: int, acc: dict[int, int], prefix: str = "vllm") -> str:
    lab = 'engine="0",model_name="tiny:llama"'
    return "".join([f"{prefix}:spec_decode_num_drafts_total{{{lab}}} {drafts}\n",
                    *(f'{prefix}:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {a}\n'
                      for p, a in acc.items())])


def _live_cases() -> list[Case]:
    zero = _counters(0, {0: 0, 1: 0}, "llamacpp")
    return [
        Case("i55-live-llama-50-over-1-draft", 1, _live(True, metrics=[zero, _counters(1, {0: 50, 1: 0}, "llamacpp")]),
             check=_server_blamed("50 accepted at position 0 over 1 draft")),
        Case("i55-live-llama-mean-length-181", 1, _live(True, metrics=[zero, _counters(1, {0: 90, 1: 90}, "llamacpp")]),
             check=_server_blamed("mean acceptance length 181.00")),
        Case("i55-live-vllm-positions-0-and-200", 1,
             _live(metrics=[_counters(0, {0: 0, 200: 0}), _counters(10, {0: 6, 200: 3})]),
             check=_server_blamed("labelled position 0, 200")),
        Case("i55-live-vllm-later-position-more", 1,
             _live(metrics=[_counters(0, {0: 0, 1: 0}), _counters(10, {0: 3, 1: 7})]),
             check=_server_blamed("7 accepted at position 1 but 3 at position 0")),
        Case("i55-live-trickled-completion", 2, _live(False, args=("--deadline", 5), trickle_s=0.3),
             words=("deadline of 5 s ran out while waiting for the server's answer to prompt 1 of 2",
                    "0 of 2 prompts answered"), strict=False, timeout=90),
        Case("i55-live-llama-trickled-completion", 2, _live(True, args=("--deadline", 5), trickle_s=0.3),
             words=("deadline of 5 s ran out while waiting for the server's answer to prompt 1 of 2",),
             strict=False, timeout=90),
        Case("i55-live-props-list", 3, _live(True, props=[1, 2]), words=("/props answered a JSON list",)),
        Case("i55-live-props-200mb", 3, _live(True, props_bytes=200 << 20),
             words=("/props failed (reply larger than 4 MB)",)),
        Case("i55-live-props-no-answer", 3, _live(True, props_stall_s=120), words=("/props failed", "timed out"),
             timeout=120),
    ]


# a `c++` first on PATH that answers version questions as the real one does and fails every compile and link, so
# a rebuild fails at once and the fallback shows (a real rebuild is a minute of compiling)
_CXX = """#!/bin/sh
for a in "$@"; do case "$a" in *.cpp|*.o|-shared) echo "c++: refusing to build" >&2; exit 1;; esac; done
exec {real} "$@"
"""


def _cut_kernel(w: World, d: Path) -> list:
    """The real cached kernel build, copied into a cache of its own and cut to 100 kB."""
    from eaglewire.targets import smallm
    from eaglewire.targets.load import cache_dir

    args = ["generate", "--target", "tiny:llama", "--prompt", "Hello", "--max-new-tokens", 4, "--device", "cpu"]
    if smallm.smallm_kernel() is None:  # nothing cached to cut on this machine: the run must still work
        write(d / "no-kernel", str(smallm._STATE.get("why")))
        return args
    built = cache_dir() / "kernels" / f"smallm-{smallm.kernel_key()}"
    dst = d / "cache" / "kernels" / built.name
    shutil.copytree(built, dst, ignore=shutil.ignore_patterns("lock", ".ninja_lock"))
    so = next(dst.glob("*.so"))
    with open(so, "r+b") as f:
        f.truncate(100_000)
    os.utime(so)
    write(d / "bin" / "c++", _CXX.format(real=shutil.which(os.environ.get("CXX", "c++")))).chmod(0o755)
    return args


def _run_with_cache(w: World, d: Path, args: list) -> Res:
    env = {k: v for k, v in CLI_ENV.items() if k != "CXX"}
    env.update(EAGLEWIRE_CACHE=str(d / "cache"), PATH=f"{d / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    cmd = [sys.executable, "-m", "eaglewire.cli", *map(str, args)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=env, timeout=300)
        return Res(cmd, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    except subprocess.TimeoutExpired as e:
        return Res(cmd, None, str(e.stdout or ""), str(e.stderr or ""), time.monotonic() - t0, timed_out=True)


def _fell_back(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc} (-7 or 135: SIGBUS): {res.stderr.strip().splitlines()[-1:]}")
    if (d / "no-kernel").exists():
        return f"no kernel on this machine ({(d / 'no-kernel').read_text()}): nothing cached to cut"
    note = next((ln for ln in res.stderr.splitlines() if "cached kernel" in ln and "is not used" in ln), "")
    need(note and "100000 bytes" in note, f"no line naming the cut-short kernel: {res.stderr.strip()[-200:]}")
    return note


def _deep(name: str, text: str):
    def prep(w: World, d: Path) -> Path:
        return write(d / name, text)
    return prep


def issue55b() -> list[Case]:
    nested = "[" * DEEP + "]" * DEEP
    jsonl = _deep("p.jsonl", '{"prompt": "hi"}\n' + nested + "\n")
    one = _deep("p.json", '{"a":' * DEEP + "1" + "}" * DEEP)
    config = _deep("config.json", '{"model_type": "llama", "x": ' + nested + "}")
    gen = ["data", "generate", "--target", "tiny:llama", "--max-new-tokens", 4, "--device", "cpu"]
    return [
        *_live_cases(),
        Case("i55-kernel-cut-short", 4, _cut_kernel, check=_fell_back, run=_run_with_cache, timeout=300),
        Case("i55-prompts-deep-jsonl", 6, lambda w, d: [*gen, "--prompts", jsonl(w, d), "--out", d / "out"],
             words=("p.jsonl:2: JSON nested too deep",)),
        Case("i55-prompts-deep-json", 6, lambda w, d: [*gen, "--prompts", one(w, d), "--out", d / "out"],
             words=("p.json: JSON nested too deep",)),
        Case("i55-plan-deep-model-config", 6, lambda w, d: ["plan", "--model-config", config(w, d)],
             words=("config.json: JSON nested too deep",)),
    ]
