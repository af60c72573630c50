"""Commands about the target itself: what it is, which ids name its layers, what it holds at a point.

`inspect` and `capture` load the target; `layers` converts ids between
engines without loading anything. The work is in targets/describe.py and
targets/layers.py; this file registers the commands and prints their results.
"""

from __future__ import annotations

import typer

from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit
from eaglewire.targets.config import CaptureConfig, InspectConfig, LayersConfig


def _s(v) -> str:
    return "null" if v is None else str(v)


def run_inspect(cfg: InspectConfig) -> None:
    from eaglewire.targets.describe import inspect_target
    from eaglewire.targets.hybrid import describe as describe_linear

    def human(r):
        for k in ("target", "path", "architecture", "language_model", "num_layers", "hidden_size", "vocab_size",
                  "num_parameters", "chat_template"):
            print(f"{k:>16}: {r[k]}")
        for eng, e in r["engines"].items():
            print(f"{eng:>16}: " + (e["refusal"] or f"EAGLE-3 capture {e['support']} for {r['architecture']}"))
        if r["layer_types"]:
            print(f"{'captured layers':>16}: " + ", ".join(f"{n} on {k}" for n, k in r["layer_types"].items()))
        for line in describe_linear(r["linear_capture"]):
            print(f"{'':>16}  {line}")
        dc = r["default_capture"]
        print("  EAGLE-3 default capture (physical name -> HF, SGLang, vLLM and llama.cpp ids; `eaglewire layers` "
              "for the others):")
        print(f"    {'point':<16}{'hf':>6}{'sglang':>8}{'vllm':>6}{'llama.cpp':>11}")
        for i, n in enumerate(dc["names"]):
            print(f"    {n:<16}{_s(dc['hf_index'][i]):>6}{_s(dc['sglang'][i]):>8}{_s(dc['vllm'][i]):>6}"
                  f"{_s(dc['llama.cpp'][i]):>11}")

    emit(inspect_target(cfg), cfg.json, human)


def run_layers(cfg: LayersConfig) -> None:
    from eaglewire.targets.layers import convert_layers

    def human(r):
        keys = ["hf_index", "sglang", "sglang_deepseek", "specforge", "vllm", "speculators", "llama.cpp"]
        print(f"reading {r['from']['ids']} as {r['from']['engine']} ids"
              + "".join(f"\n  assumed: {a}" for a in r["from"]["assumed"]))
        print(f"{'point':<16}" + "".join(f"{k:>16}" for k in keys))
        for i, n in enumerate(r["names"]):
            print(f"{n:<16}" + "".join(f"{_s(r[k][i]):>16}" for k in keys))
        for w in r["warnings"]:
            print(f"warning: {w}")

    emit(convert_layers(cfg), cfg.json, human)


def run_capture(cfg: CaptureConfig) -> None:
    from eaglewire.targets.describe import capture_text

    emit(capture_text(cfg), cfg.json, lambda r: print(f"wrote {r['out']}: {r['num_tokens']} tokens x {len(r['points'])} points ({', '.join(r['points'])})"))


def register(app: typer.Typer) -> None:
    build_command(app, "inspect", InspectConfig, run_inspect, "Describe a target and its EAGLE-3 default capture in HF, SGLang and vLLM ids (`layers` converts to the rest).")
    build_command(app, "layers", LayersConfig, run_layers, "Convert layer ids between engines (SGLang, vLLM, HF, ...) via physical names.")
    build_command(app, "capture", CaptureConfig, run_capture, "Capture physically named target tensors for a text into a safetensors file.")
