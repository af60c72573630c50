"""Which engine eaglewire can do what with, as one table the README embeds (a test keeps them equal).

A newcomer asks "can I serve this on vLLM, check it live on SGLang, run it on
this CPU?" before reading any command's help. The cells that a command's own
options decide are read from them (export formats, serve's and doctor's
engines, the SGLang launch builder's default shape), so the README cannot
claim a flag the code does not take; the rest names the module that decides it.
It sits in the top room because it reads the options of several stages.
"""

from __future__ import annotations

import dataclasses
import inspect

from eaglewire.engines.sglang import launch_command
from eaglewire.saved.formats import FORMATS
from eaglewire.serve.config import ServeConfig
from eaglewire.targets.registry import engine_spec

GGUF = "gguf"  # `export --format gguf`: export/exporter.py hands it to llama.cpp's converter
# engine row -> its name in the table; the facts are the engine registry's (targets/registry.py)
ROWS = {"sglang": "SGLang", "vllm": "vLLM", "llama.cpp": "llama.cpp (llama-cpp-python)",
        "speculators": "speculators (read by vLLM)", "eaglewire": "eaglewire's own engine"}
# what each drafts as eaglewire wires it: SGLang's from launch_command (topk), the others by their module
DRAFTS = {"vllm": "chain (num_speculative_tokens: engines/vllm_server.py)",
          "llama.cpp": "chain (--spec-draft-p-min gated: engines/llama_server.py)",
          "speculators": "chain (vLLM loads it)",
          "eaglewire": "chain, tree, tree + lookup (decoding/)"}
# how `doctor live` recognises a running server (doctor/live.py), and that it predicts a chain only
LIVE = {"sglang": "yes, chain only (/server_info)", "vllm": "yes (/version, /metrics)",
        "llama.cpp": "yes (/props, /metrics)", "speculators": "as vLLM", "eaglewire": "the reference it compares to"}

# the parallel drafters (docs/parallel-drafters.md) per engine: what exports, serves and checks them
PARALLEL = {"sglang": "DFlash: `--format sglang`, printed (DFLASH); P-EAGLE: no (0.5.23 has none)",
            "vllm": "DFlash (`dflash`) and P-EAGLE (`parallel_drafting`): served and checked here",
            "llama.cpp": "DFlash: `--format gguf` (its converter), not served by `serve`; P-EAGLE: no",
            "speculators": "DFlash and P-EAGLE layouts (`--format speculators`)",
            "eaglewire": "DFlash blocks (greedy, sampled), P-EAGLE (greedy, sampled): decoding/dflash.py, peagle.py"}


def _serve_choices() -> tuple[str, ...]:
    return next(f for f in dataclasses.fields(ServeConfig) if f.name == "engine").metadata["choices"]


def _sglang_drafts() -> str:
    topk = inspect.signature(launch_command).parameters["topk"].default
    return f"chain (topk {topk}, what `serve` prints); tree with topk > 1"


def _serve(key: str) -> str:
    spec = engine_spec(key)
    if key not in _serve_choices() or not spec:
        return "no"
    return "--print-command only (CUDA)" if spec.serve == "print" else "started and checked here"


def _cpu(key: str) -> str:
    """An engine serve starts here runs on this CPU (vLLM's CPU wheel, llama.cpp built from source), as does our own;
    one whose drafters another engine serves runs where that one does."""
    spec = engine_spec(key)
    if key == "eaglewire" or (spec.runs_here and _serve(key).startswith("started")):
        return "yes"
    runtime = engine_spec(spec.runtime) if spec.runtime != key else None
    return f"as {ROWS[runtime.name]}" if runtime and runtime.runs_here else "no (CUDA)"


def rows() -> list[dict]:
    """One row per engine; every cell a string, "no" where eaglewire has no path to it."""
    out = []
    for key, title in ROWS.items():
        spec = engine_spec(key)
        fmt = spec.formats[0] if spec and spec.formats else ""
        fmt_ok = fmt in FORMATS or fmt == GGUF
        out.append({"engine": title, "pinned": spec and spec.pinned or "",
                    "drafts": _sglang_drafts() if key == "sglang" else DRAFTS[key],
                    "export": f"`--format {fmt}`" if fmt and fmt_ok else "no (its own checkpoint)" if key == "eaglewire" else "no",
                    "serve": _serve(key),
                    "doctor_config": "yes" if spec and spec.doctor_config else "no (`doctor drafter`, `doctor online`)",
                    "live": LIVE[key],
                    "cpu": _cpu(key), "parallel": PARALLEL[key]})
    return out


def markdown() -> str:
    head = ("| engine | pinned | drafts | `export` | `serve --engine` | `doctor config --engine` | `doctor live` | "
            "runs on this CPU | DFlash, P-EAGLE |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(f"| {r['engine']} | {r['pinned'] or '-'} | {r['drafts']} | {r['export']} | {r['serve']} | "
                          f"{r['doctor_config']} | {r['live']} | {r['cpu']} | {r['parallel']} |\n" for r in rows())
