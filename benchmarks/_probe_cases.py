"""The cases of issue 26 ("Hardening, second pass") for `probe_hardening.py`, items 1-7.

Each case makes its inputs in its own directory `d`, names the `eaglewire` arguments,
and says what a hostile user would accept: either an error (exit 2, one `error:`
line holding `words`; `{d}` stands for the case directory) or the right result
(`check`, which raises `Wrong`); `protect` lists paths under `d` that must come out
unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _probe_world import Res, World, interrupt, prompts, write


class Wrong(Exception):
    """The outcome is not the expected one (the message says how)."""


def need(cond, msg: str) -> None:
    if not cond:
        raise Wrong(msg)


@dataclass
class Case:
    name: str
    item: int
    prep: Callable[[World, Path], list]  # makes the inputs under d, returns the CLI arguments
    words: tuple | None = None  # an error is expected: exit 2 and one `error:` line holding these (a tuple = any of)
    check: Callable | None = None  # the right result: (res, w, d) -> detail, raises Wrong
    post: Callable | None = None  # after the expected error: more to verify, raises Wrong
    protect: tuple[str, ...] = ()  # paths under d that must come out unchanged
    timeout: float = 120
    umask: int = -1
    mem_gib: float | None = None
    strict: bool = True  # other stderr lines are noted in the detail (False: progress bars may precede the error)
    run: Callable | None = None  # a custom run: (w, d, args) -> Res


def _rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _line(text: str, word: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if word in ln), "")


def _stored(res: Res, w: World, d: Path, content: str = "Blue.") -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
    rows = _rows(d / "out" / "responses.jsonl")
    need(len(rows) == 1 and rows[0].get("messages", [{}])[-1].get("content") == content,
         f"responses.jsonl holds {rows!r:.120}")
    return f"stored {content!r} after {w.server.posts} request(s)"


# ---------------------------------------------------------------------------------------------- item 1


def _ck(w, d):
    return w.copy(w.ckpt, d / "ck")


def _mine(d):
    write(d / "mine" / "thesis.tex", "years of work")
    return d / "mine"


def _replaced(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
    need("replaced" in res.stderr, f"nothing says what was replaced: {res.stderr.strip()[-200:]!r}")
    need((d / "old" / "model.safetensors").is_file(), "no model.safetensors in the replaced --out")
    return _line(res.stderr, "replaced")


def item1() -> list[Case]:
    exp = lambda w, d, fmt="vllm": w.copy(w.export(fmt), d / "src")  # noqa: E731
    return [
        Case("export-force-foreign-dir", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out", _mine(d),
                                                          "--force"], words=("{d}/mine",), protect=("mine", "ck")),
        Case("import-force-foreign-dir", 1, lambda w, d: ["import", exp(w, d, "sglang"), "--out", _mine(d),
                                                          "--target-layers", 8, "--force"], words=("{d}/mine",),
             protect=("mine", "src")),
        Case("export-force-onto-source", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out", d / "ck",
                                                          "--force"], words=("{d}/ck",), protect=("ck",)),
        Case("export-force-onto-source-parent", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out", d,
                                                                 "--force"], words=("{d}",), protect=(".",)),
        Case("import-force-onto-source", 1, lambda w, d: ["import", exp(w, d), "--out", d / "src", "--target-layers", 8,
                                                          "--force"], words=("{d}/src",), protect=("src",)),
        Case("export-force-onto-plain-file", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out",
                                                              write(d / "notes.txt", "mine"), "--force"],
             words=("notes.txt",), protect=("notes.txt", "ck")),
        Case("export-no-force-onto-earlier-export", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out",
                                                                     w.copy(w.export("vllm"), d / "old")],
             words=("{d}/old", "--force"), protect=("old",)),
        Case("export-force-onto-earlier-export", 1, lambda w, d: ["export", _ck(w, d), "--format", "vllm", "--out",
                                                                  w.copy(w.export("vllm"), d / "old"), "--force"],
             check=_replaced, protect=("ck",)),
        Case("import-force-onto-earlier-import", 1, lambda w, d: ["import", exp(w, d, "sglang"), "--out",
                                                                  w.copy(w.imported_no_target, d / "old"),
                                                                  "--target-layers", 8, "--force"],
             check=_replaced, protect=("src",)),
    ]


# ---------------------------------------------------------------------------------------------- item 2


def _regen(w: World, d: Path, bare: bool = False, **change) -> list:
    opts = {} if bare else {"--target": "tiny:qwen3", "--max-new-tokens": 8, **change}
    data = w.copy(w.qwen_answers, d / "data")
    return ["data", "generate", "--resume", "--out", data, "--prompts", w.qwen_prompts, "--device", "cpu",
            *[x for kv in opts.items() for x in kv]]


def _took_recorded(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
    cfg = json.loads((d / "data" / "generate.config.json").read_text())["config"]
    need(cfg.get("target") == "tiny:qwen3" and cfg.get("max_new_tokens") == 8,
         f"generate.config.json now records target {cfg.get('target')!r}, max_new_tokens {cfg.get('max_new_tokens')!r}")
    return "recorded target tiny:qwen3, 8 tokens kept"


def _extracted_with_recorded(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
    man = json.loads((d / "data" / "manifest.json").read_text())
    n = len([r for r in _rows(d / "data" / "responses.jsonl") if "messages" in r])
    need(man["target"]["source"] == "tiny:qwen3", f"extracted with {man['target']['source']!r} over tiny:qwen3's answers")
    need(man.get("complete") and man.get("num_samples") == n, f"manifest: complete {man.get('complete')}, "
         f"{man.get('num_samples')} of {n} samples")
    left = [p.name for p in (d / "data").glob("rank-*")]
    need(not left, f"extracted with tiny:qwen3, complete, but {left} left behind (unreferenced shards)")
    return f"tiny:qwen3, {n} samples, no rank-* left"


def item2() -> list[Case]:
    online = ["train", "--online", "--target", "tiny:llama", "--max-steps", 1, "--device", "cpu", "--vocab-size", 50]
    no_drafter = lambda res, w, d: need(not (d / "run" / "drafter").exists(), "a drafter was written")  # noqa: E731
    return [
        Case("train-online-other-targets-answers", 2, lambda w, d: [*online, "--data", w.copy(w.qwen_answers, d / "data"),
                                                                    "--out", d / "run"],
             words=("tiny:qwen3", "tiny:llama"), post=no_drafter, protect=("data",)),
        Case("train-offline-other-target", 2, lambda w, d: ["train", "--data", w.copy(w.llama_ds, d / "data"), "--target",
                                                            "tiny:mistral", "--out", d / "run", "--max-steps", 1,
                                                            "--device", "cpu"],
             words=("tiny:mistral",), post=no_drafter, protect=("data",)),
        Case("generate-resume-other-target", 2, lambda w, d: _regen(w, d, **{"--target": "tiny:llama"}),
             words=("--target", "tiny:llama", "tiny:qwen3"), protect=("data",)),
        Case("generate-resume-other-max-new-tokens", 2, lambda w, d: _regen(w, d, **{"--max-new-tokens": 16}),
             words=("--max-new-tokens", "16"), protect=("data",)),
        Case("generate-resume-other-temperature", 2, lambda w, d: _regen(w, d, **{"--temperature": 0.7}),
             words=("--temperature", "0.7"), protect=("data",)),
        Case("generate-resume-recorded-settings", 2, lambda w, d: _regen(w, d, bare=True),
             check=_took_recorded, protect=("data/responses.jsonl",)),
        Case("extract-sharded-killed-resume-no-target", 2, lambda w, d: ["data", "extract", w.sharded_killed(d),
                                                                         "--resume", "--device", "cpu"],
             words=("--nproc_per_node",), check=_extracted_with_recorded, protect=("data/responses.jsonl",)),
        Case("extract-resume-other-target", 2, lambda w, d: ["data", "extract", w.copy(w.qwen_answers, d / "data"),
                                                             "--target", "tiny:llama", "--resume", "--device", "cpu"],
             words=("tiny:llama", "tiny:qwen3"), protect=("data",)),
    ]


# ---------------------------------------------------------------------------------------------- items 3, 4


def _server_args(w: World, d: Path, mode: str, *extra) -> list:
    return ["data", "generate", "--target", "tiny:llama", "--prompts", prompts(d / "p.jsonl", 1), "--max-new-tokens", 16,
            "--out", d / "out", "--server", w.server.set(mode), *extra]


def _listed(reason, asks: int | None = None):
    """After `1 of 1 requests failed`: failures.jsonl holds the reason, nothing was stored, retries were made."""
    def post(res: Res, w: World, d: Path) -> None:
        fails = _rows(d / "out" / "failures.jsonl")
        need(len(fails) == 1, f"failures.jsonl holds {len(fails)} rows")
        why = fails[0].get("error", "")
        need(any(r in why for r in ((reason,) if isinstance(reason, str) else reason)),
             f"failures.jsonl reason {why[:100]!r} does not say {reason!r}")
        need(not [r for r in _rows(d / "out" / "responses.jsonl") if "messages" in r], "an answer was stored")
        need(asks is None or w.server.posts == asks, f"asked {w.server.posts} times, expected {asks} (1 + --retries 1)")
        return f"exit 2, failures.jsonl ({w.server.posts} asked): {why}"
    return post


def _fault(name: str, mode: str, reason, asks: int | None = None) -> Case:
    return Case(name, 3, lambda w, d: _server_args(w, d, mode, "--retries", 1, "--request-timeout", 5),
                words=("failures.jsonl", "1 of 1 requests failed"), post=_listed(reason, asks), strict=False, timeout=90)


def _interrupted(w: World):
    """`data generate --server` (default retries and timeout) interrupted while 2 of 4 requests hang on the server."""
    if w._interrupted is None:
        d = w.tmp / "interrupted"
        d.mkdir()
        args = ["data", "generate", "--target", "tiny:llama", "--prompts", prompts(d / "p.jsonl", 4), "--max-new-tokens",
                16, "--out", d / "out", "--server", w.server.set("good-then-slow"), "--concurrency", 2]
        res, stop_s = interrupt(args, d, lambda: w.server.posts >= 4)
        w._interrupted = (d / "out", args, res, stop_s, _rows(d / "out" / "responses.jsonl"))
    return w._interrupted


def _stopped(res: Res, w: World, d: Path) -> str:
    _, _, _, stop_s, rows = _interrupted(w)
    need(stop_s is not None and stop_s < 10, f"exited {stop_s:.1f} s after SIGINT" if stop_s is not None else "did not exit")
    need(res.rc != 0, "exit 0 after SIGINT")
    need("--resume" in res.stderr, f"no word of --resume: {res.stderr.strip()[-200:]!r}")
    need(len(rows) == 2, f"responses.jsonl kept {len(rows)} rows, 2 were answered before SIGINT")
    return f"exit {res.rc} {stop_s:.2f} s after SIGINT, 2 answers kept: {_line(res.stderr, '--resume')[:60]}"


def _resume_after_interrupt(w: World, d: Path) -> list:
    out, args, _, _, _ = _interrupted(w)
    w.copy(out, d / "out")
    w.server.set("good")
    return [*args[:-6], "--out", d / "out", "--server", w.server.url, "--resume"]


def _resumed(res: Res, w: World, d: Path) -> str:
    before = _interrupted(w)[4]
    rows = _rows(d / "out" / "responses.jsonl")
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
    need(sorted(r["index"] for r in rows) == [0, 1, 2, 3], f"indices {[r['index'] for r in rows]}")
    need(all(r in rows for r in before), "an answer written before SIGINT changed")
    need(w.server.posts == 4 - len(before), f"asked {w.server.posts} times for {4 - len(before)} missing answers")
    return f"{len(before)} kept + {w.server.posts} asked = 4 answers"


def _deadline(res: Res, w: World, d: Path) -> str:
    listed = _listed("request-timeout")(res, w, d)
    need(res.seconds < 30, f"took {res.seconds:.0f} s for --request-timeout 2 x 2 attempts")
    return f"{res.seconds:.0f} s; {listed}"


def _plan_cfg(w: World, d: Path, arch: str = "llama", drop: tuple = (), **change) -> list:
    cfg = {k: v for k, v in {**w.target_config(arch), **change}.items() if k not in drop}
    return ["plan", "--model-config", write(d / "config.json", json.dumps(cfg)), "--samples", 10, "--seq-len", 64]


def items34() -> list[Case]:
    return [
        _fault("server-incomplete-read", "incomplete", "IncompleteRead", asks=2),
        _fault("server-bad-status-line", "bad-status-line", ("BadStatusLine", "status line"), asks=2),
        _fault("server-not-utf8", "not-utf8", ("UTF-8", "utf-8", "not JSON"), asks=2),
        _fault("server-content-int", "int-content", "content"),
        _fault("server-message-not-object", "message-string", "message"),
        _fault("server-usage-not-object", "usage-list", "usage"),
        _fault("server-no-content-key", "no-content-key", "content"),
        _fault("server-20mb-answer-16-tokens", "huge-answer", ("characters", "MB", "bytes")),
        _fault("server-completion-tokens-1e15", "huge-count", ("1000000000000000", "tokens")),
        Case("server-content-list-of-parts", 3, lambda w, d: _server_args(w, d, "parts", "--retries", 1),
             check=_stored, timeout=90),
        Case("server-incomplete-once-is-retried", 3, lambda w, d: _server_args(w, d, "first-incomplete", "--retries", 1),
             check=_stored, timeout=90),
        Case("server-without-scheme", 3, lambda w, d: ["data", "generate", "--target", "tiny:llama", "--prompts",
                                                       prompts(d / "p.jsonl", 1), "--out", d / "out", "--server",
                                                       "localhost"], words=("localhost", "http://")),
        Case("server-trickle-whole-request-deadline", 4, lambda w, d: _server_args(w, d, "trickle", "--retries", 1,
                                                                                   "--request-timeout", 2),
             words=("failures.jsonl", "1 of 1 requests failed"), post=_deadline, strict=False, timeout=60),
        Case("server-sigint-stops-within-seconds", 4, lambda w, d: [],
             run=lambda w, d, args: _interrupted(w)[2], check=_stopped),
        Case("server-resume-after-sigint", 4, _resume_after_interrupt, check=_resumed, timeout=90),
        Case("plan-num-hidden-layers-1e7", 4, lambda w, d: _plan_cfg(w, d, num_hidden_layers=10_000_000),
             words=("config.json", "num_hidden_layers"), mem_gib=6, timeout=60),
    ]
