"""Issue 36 ("Hardening, third pass") for `probe_hardening.py`: paths that input names, custom model code,
a loopback capture server, help texts that render, and small bad values;
`doctor live` against a fake vLLM server (item 9: the issue's doctor live findings); sizes in a
drafter's or an imported config.json (item 10); `train --resume` with
other spellings of its paths and required options in --config (item 11); a full disk (item 12, as `ulimit -f`);
a truncated target and garbage `data import` files (item 13); stored answer ids and a 3 GiB `--target` file (item 14).

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


def _live(**server):
    """`doctor live` of the tiny drafter against a fake vLLM server playing `server` (fake_vllm.FakeVllm)."""
    def prep(w: World, d: Path) -> list:
        from eaglewire_testing.fake_vllm import models

        srv = w.vllm(**{"served": models("tiny:llama"), **server})
        return ["doctor", "live", "--server", srv.url, "--drafter", w.drafter, "--num-prompts", 2, "--max-new-tokens", 4]
    return prep


def _live_cases() -> list[Case]:
    from eaglewire_testing.fake_vllm import counters, models

    nan = counters(5, [1, 1]).replace(' 5\n', ' NaN\n', 1)
    no_pos = counters(5, [1, 1]) + "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\"} 4\n"
    return [
        Case("i36-live-serves-another-model", 9, _live(served=models("Qwen/Qwen3-8B")),
             words=("/v1/models", "not the drafter's target")),
        Case("i36-live-models-wrong-shape", 9, _live(served={"data": ["tiny:llama"]}), words=("/v1/models", "data[0]")),
        Case("i36-live-version-list", 9, _live(version=["0.32.0"]), words=("/version", "JSON object")),
        Case("i36-live-metric-nan", 9, _live(metrics=[nan]), words=("/metrics line", "not a count")),
        Case("i36-live-per-pos-without-label", 9, _live(metrics=[no_pos]), words=("/metrics line", 'position="N"')),
        Case("i36-live-counters-backwards", 9, _live(metrics=[counters(15, [7, 4]), counters(5, [1, 1])]),
             words=("went from 15 to 5", "restart")),
        Case("i36-live-metrics-trickle", 9, _live(trickle_s=0.2), words=("/metrics", "no complete reply within")),
    ]


def _sized(kind: str, field: str, value):
    """A copy of the test checkpoint (`ck`) or of its SGLang export (`import`) whose config.json states `value`."""
    def prep(w: World, d: Path) -> list:
        src = w.copy(w.ckpt if kind == "ck" else w.export("sglang"), d / "src")
        raw = json.loads((src / "config.json").read_text())
        (raw["eaglewire_drafter_config"] if kind == "ck" else raw)[field] = value
        write(src / "config.json", json.dumps(raw))
        if kind == "ck":
            return ["export", src, "--format", "sglang", "--out", d / "out"]
        return ["import", src, "--out", d / "out", "--target-layers", 8]
    return prep


def _size_cases() -> list[Case]:
    words = lambda f: ("src/config.json", f"field {f} =")  # noqa: E731
    return [Case(f"i36-{kind}-config-{field}-{value:.0e}", 10, _sized(kind, field, value), words=words(field),
                 mem_gib=4, post=_not("out", "an artifact was written"))
            for kind, field, value in [("ck", "num_layers", 10**7), ("ck", "vocab_size", 10**12),
                                       ("ck", "hidden_size", 10**9), ("import", "num_hidden_layers", 10**7),
                                       ("import", "vocab_size", 10**12), ("import", "hidden_size", 10**9)]]


def _small_files(limit: int):
    """A run under `ulimit -f` (SIGXFSZ ignored, so a write past `limit` bytes fails as a full disk would)."""
    def run(w: World, d: Path, args: list) -> Res:
        import resource
        import signal

        def limit_files():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        cmd = [sys.executable, "-m", "eaglewire.cli", *map(str, args)]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=CLI_ENV, timeout=180,
                               preexec_fn=limit_files)
            return Res(cmd, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        except subprocess.TimeoutExpired as e:
            return Res(cmd, None, str(e.stdout or ""), str(e.stderr or ""), time.monotonic() - t0, timed_out=True)
    return run


def _full_cases() -> list[Case]:
    full = ("file size limit reached while writing", "disk full while writing")

    def export_force(w: World, d: Path) -> list:
        out = w.copy(w.export("sglang"), d / "out")
        return ["export", w.ckpt, "--format", "sglang", "--out", out, "--force"]

    def vocab(w: World, d: Path) -> list:
        return ["data", "vocab", w.copy(w.llama_ds, d / "ds"), "--vocab-size", 30]

    return [
        Case("i36-full-disk-train", 12, lambda w, d: ["train", "--data", w.llama_ds, "--out", d / "run", "--device", "cpu",
                                                      "--max-steps", 2, "--save-every", 1],
             words=(full, "state/"), run=_small_files(16 << 10), strict=False, post=_not("run/drafter", "drafter written")),
        Case("i36-full-disk-data-vocab", 12, vocab, words=(full, "vocab.safetensors"), run=_small_files(1 << 10),
             protect=("ds/vocab.safetensors", "ds/vocab.json", "ds/manifest.json")),
        Case("i36-full-disk-export-force", 12, export_force, words=(full,), run=_small_files(16 << 10),
             protect=("out/model.safetensors", "out/config.json")),
        Case("i36-full-disk-data-build", 12, lambda w, d: ["data", "build", "--target", "tiny:llama", "--device", "cpu",
                                                           "--max-new-tokens", 4, "--vocab-size", 50, "--out", d / "out",
                                                           "--prompts", prompts(d / "p.jsonl", 4)],
             words=(full, "shard-00000.safetensors"), run=_small_files(4 << 10), strict=False),
    ]


def _resume_cases() -> list[Case]:
    import os

    same = ["--device", "cpu", "--max-steps", 2, "--save-every", 1, "--resume"]  # as World.killed_run started it

    def relative(w: World, d: Path) -> list:  # started with absolute paths, resumed with relative ones
        w.killed_run(d)
        return ["train", "--data", os.path.relpath(w.llama_ds, d), "--out", "run", *same]

    def moved(w: World, d: Path) -> list:
        shutil.move(w.killed_run(d), d / "moved")
        return ["train", "--data", w.llama_ds, "--out", d / "moved", *same]

    def in_config(w: World, d: Path) -> list:  # the required --data and --out only in the --config file
        cfg = {"data": str(w.llama_ds), "out": str(d / "run"), "max_steps": 1, "device": "cpu"}
        return ["train", "--config", write(d / "train.json", json.dumps(cfg))]

    def finished(where: str):
        def check(res: Res, w: World, d: Path) -> str:
            need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
            need((d / where / "drafter").is_dir(), f"no {where}/drafter")
            return f"{where}/drafter written"
        return check

    return [Case("i36-train-resume-relative-paths", 11, relative, check=finished("run")),
            Case("i36-train-resume-moved-run", 11, moved, check=finished("moved")),
            Case("i36-train-required-options-in-config", 11, in_config, check=finished("run"))]


def _broken_files_cases() -> list[Case]:
    def truncated_target(w: World, d: Path) -> list:
        from eaglewire.targets.load import load_target

        t = w.copy(load_target("tiny:llama").path, d / "t")
        f = t / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        return ["inspect", "--target", t, "--device", "cpu"]

    def speculators(w: World, d: Path) -> list:
        write(d / "src" / "hidden_states" / "hs_0.safetensors", b"\x10\x00" * 40)
        return ["data", "import", d / "src", "--out", d / "ds", "--all-loss"]

    def specforge(w: World, d: Path) -> list:
        import torch

        (d / "src" / "rows_0").mkdir(parents=True)
        torch.save({"input_ids": torch.zeros(4).long(), "aux_hidden_state": torch.zeros(1, 4, 96)},
                   d / "src" / "rows_0" / "data_0.ckpt")
        return ["data", "import", d / "src", "--out", d / "ds"]

    return [Case("i36-inspect-truncated-safetensors", 13, truncated_target,
                 words=("t/model.safetensors", "not a whole safetensors file")),
            Case("i36-data-import-garbage-speculators", 13, speculators,
                 words=("hs_0.safetensors", "not a whole safetensors file")),
            Case("i36-data-import-specforge-missing-keys", 13, specforge, words=("data_0.ckpt", "hidden_state"))]


def _answer_ids_cases() -> list[Case]:
    """Stored answer ids (tokens, not text): a mistyped or out-of-vocabulary id names responses.jsonl's line."""
    def rows(ids):
        def prep(w: World, d: Path) -> list:
            data = w.copy(w.llama_answers, d / "data")
            lines = (data / "responses.jsonl").read_text().splitlines()
            row = json.loads(lines[1])
            row["answer_ids"] = ids
            write(data / "responses.jsonl", "\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
            return ["data", "extract", data, "--target", "tiny:llama", "--device", "cpu"]
        return prep

    def stored(res: Res, w: World, d: Path) -> str:
        need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
        man = json.loads((d / "data" / "manifest.json").read_text())
        got = man.get("answer_tokens") or {}
        need(got.get("target_ids", 0) > 0 and not got.get("retokenized_text"), f"answer_tokens {got}")
        return f"samples from the target's ids: {got}"

    line = ("responses.jsonl:2", "answer_ids")
    return [Case("i36-extract-answer-ids-mistyped", 14, rows([5, "x"]), words=line, post=_not("data/manifest.json", "extracted")),
            Case("i36-extract-answer-ids-outside-vocab", 14, rows([5, 10 ** 9]), words=line,
                 post=_not("data/manifest.json", "extracted")),
            Case("i36-extract-answer-ids-used", 14, lambda w, d: ["data", "extract", w.copy(w.llama_answers, d / "data"),
                                                                  "--target", "tiny:llama", "--device", "cpu"], check=stored)]


def _big_file_cases() -> list[Case]:
    """`--target` naming a 3 GiB (sparse) file: its header says what it is, it is never read whole."""
    def big(name: str, head: bytes = b""):
        def prep(w: World, d: Path) -> list:
            with open(d / name, "wb") as f:
                f.write(head)
                f.truncate(3 << 30)
            return ["inspect", "--target", d / name, "--device", "cpu"]
        return prep

    return [Case("i36-target-big-file-no-suffix", 14, big("model"), words=("model", "no config.json"), mem_gib=4, timeout=60),
            Case("i36-target-big-gguf-damaged", 14, big("model.gguf", b"GGUF\0\0\0\0"), words=("model.gguf", "GGUF version"),
                 mem_gib=4, timeout=60)]


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
        *_live_cases(),
        *_size_cases(),
        *_resume_cases(),
        *_full_cases(),
        *_broken_files_cases(),
        *_answer_ids_cases(),
        *_big_file_cases(),
    ]
