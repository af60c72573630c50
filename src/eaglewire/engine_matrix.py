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
from eaglewire.targets.points import ENGINES, PINNED

GGUF = "gguf"  # `export --format gguf`: export/exporter.py hands it to llama.cpp's converter
# engine row -> (name in the table, its `export --format`, its name for serve and doctor)
ROWS = {"sglang": ("SGLang", "sglang", "sglang"), "vllm": ("vLLM", "vllm", "vllm"),
        "llama.cpp": ("llama.cpp (llama-cpp-python)", GGUF, "llama.cpp"), "speculators": ("speculators (read by vLLM)", "speculators", ""),
        "eaglewire": ("eaglewire's own engine", "", "")}
# what each drafts as eaglewire wires it: SGLang's from launch_command (topk), the others by their module
DRAFTS = {"vllm": "chain (num_speculative_tokens: engines/vllm_server.py)",
          "llama.cpp": "chain (--spec-draft-p-min gated: engines/llama_server.py)",
          "speculators": "chain (vLLM loads it)",
          "eaglewire": "chain, tree, tree + lookup, DFlash (decoding/)"}
# how `doctor live` recognises a running server (doctor/live.py), and that it predicts a chain only
LIVE = {"sglang": "yes, chain only (/server_info)", "vllm": "yes (/version, /metrics)",
        "llama.cpp": "yes (/props, /metrics)", "speculators": "as vLLM", "eaglewire": "the reference it compares to"}


def _serve_choices() -> tuple[str, ...]:
    return next(f for f in dataclasses.fields(ServeConfig) if f.name == "engine").metadata["choices"]


def _sglang_drafts() -> str:
    topk = inspect.signature(launch_command).parameters["topk"].default
    return f"chain (topk {topk}, what `serve` prints); tree with topk > 1"


def _serve(name: str) -> str:
    if not name or name not in _serve_choices():
        return "no"
    return "--print-command only (CUDA)" if name == "sglang" else "started and checked here"


def _cpu(key: str, name: str) -> str:
    """An engine serve starts here runs on this CPU (vLLM's CPU wheel, llama.cpp built from source), as does our own."""
    if key == "eaglewire" or _serve(name).startswith("started"):
        return "yes"
    return "as vLLM" if key == "speculators" else "no (CUDA)"


def rows() -> list[dict]:
    """One row per engine; every cell a string, "no" where eaglewire has no path to it."""
    out = []
    for key, (title, fmt, name) in ROWS.items():
        fmt_ok = fmt in FORMATS or fmt == GGUF
        out.append({"engine": title, "pinned": PINNED.get("llama-cpp-python" if key == "llama.cpp" else key, ""),
                    "drafts": _sglang_drafts() if key == "sglang" else DRAFTS[key],
                    "export": f"`--format {fmt}`" if fmt and fmt_ok else "no (its own checkpoint)" if key == "eaglewire" else "no",
                    "serve": _serve(name),
                    "doctor_config": "yes" if (name or key) in ENGINES else "no (`doctor drafter`, `doctor online`)",
                    "live": LIVE[key],
                    "cpu": _cpu(key, name)})
    return out


def markdown() -> str:
    head = ("| engine | pinned | drafts | `export` | `serve --engine` | `doctor config --engine` | `doctor live` | runs on this CPU |\n"
            "|---|---|---|---|---|---|---|---|\n")
    return head + "".join(f"| {r['engine']} | {r['pinned'] or '-'} | {r['drafts']} | {r['export']} | {r['serve']} | "
                          f"{r['doctor_config']} | {r['live']} | {r['cpu']} |\n" for r in rows())
