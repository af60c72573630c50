"""Commands about the target itself: what it is, which ids name its layers, what it holds at a point.

`inspect` and `capture` load the target; `layers` converts ids between
engines without loading anything.
"""

from __future__ import annotations

import json
import sys

import typer

from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit
from eaglewire.targets.config import CaptureConfig, InspectConfig, LayersConfig

# --- inspect -------------------------------------------------------------------




def run_inspect(cfg: InspectConfig) -> None:
    from eaglewire.infra.device import resolve_device
    from eaglewire.targets.fingerprint import chat_template_hash
    from eaglewire.targets.load import load_target
    from eaglewire.targets.points import eagle3_default, id_lists

    t = _config_only(cfg.target) or load_target(cfg.target, device=resolve_device(cfg.device))
    pts = eagle3_default(t.num_layers)
    ids = id_lists(pts, t.num_layers)
    res = {
        "target": cfg.target,
        "path": str(t.path),
        "architecture": t.arch,  # what the engines dispatch on (a wrapper's class)
        "language_model": f"{type(t.model).__name__} ({t.config.model_type})",
        "model_type": t.config.model_type,
        "layer_types": _layer_types(t.config, pts),
        "engines": _engine_support(t.arch),
        "num_layers": t.num_layers,
        "hidden_size": t.hidden_size,
        "vocab_size": t.vocab_size,
        "num_parameters": sum(p.numel() for p in t.model.parameters()),
        "chat_template": bool(getattr(t.tokenizer, "chat_template", None)),
        "chat_template_sha": chat_template_hash(t.tokenizer) if t.tokenizer is not None else None,
        "eos_token_ids": t.eos_ids() if t.tokenizer is not None else None,
        "weights": t.tokenizer is not None or any(t.path.glob("*.safetensors")),
        "default_capture": {"names": ids["names"], "hf_index": ids["hf_index"], "sglang": ids["sglang"],
                            "vllm": ids["vllm"], "specforge": ids["specforge"], "speculators": ids["speculators"],
                            "sglang_deepseek": ids["sglang_deepseek"], "llama.cpp": ids["llama.cpp"]},
    }

    def human(r):
        for k in ("target", "path", "architecture", "language_model", "num_layers", "hidden_size", "vocab_size",
                  "num_parameters", "chat_template"):
            print(f"{k:>16}: {r[k]}")
        for eng, e in r["engines"].items():
            print(f"{eng:>16}: " + (e["refusal"] or f"EAGLE-3 capture {e['support']} for {r['architecture']}"))
        if r["layer_types"]:
            print(f"{'captured layers':>16}: " + ", ".join(f"{n} on {k}" for n, k in r["layer_types"].items()))
        dc = r["default_capture"]
        print("  EAGLE-3 default capture (physical name -> HF, SGLang, vLLM and llama.cpp ids; `eaglewire layers` "
              "for the others):")
        print(f"    {'point':<16}{'hf':>6}{'sglang':>8}{'vllm':>6}{'llama.cpp':>11}")
        for i, n in enumerate(dc["names"]):
            print(f"    {n:<16}{_s(dc['hf_index'][i]):>6}{_s(dc['sglang'][i]):>8}{_s(dc['vllm'][i]):>6}"
                  f"{_s(dc['llama.cpp'][i]):>11}")

    emit(res, cfg.json, human)


def _config_only(source: str):
    """A Target built on the meta device from config.json alone, when the directory holds no weights: a
    published config (Kimi-K2.5's 1T parameters) is described without downloading a shard. None otherwise."""
    import torch

    import eaglewire.targets.families as families
    from eaglewire.targets.load import Target, checked_target_dir, resolve_target_dir

    if source.startswith("tiny:") or source == "default" or source.endswith(".gguf"):
        return None
    path = resolve_target_dir(source)
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return None
    checked_target_dir(path)
    with torch.device("meta"):
        model = families.build_causal_lm(families.text_config(families.native_config(path)))
    print(f"note: {path} holds no weights: described from config.json alone (no tokenizer, no chat template)",
          file=sys.stderr)
    return Target(source=source, path=path, model=model, tokenizer=None, serving_arch=families.serving_arch(path))


def _engine_support(arch: str) -> dict[str, dict]:
    """Per pinned engine, whether it can capture EAGLE-3 features from this class at all, and why not."""
    from eaglewire.targets.points import PINNED
    from eaglewire.targets.support import capture_refusal, capture_support

    return {f"{e} {PINNED[e]}": {"support": capture_support(e, None, arch), "refusal": capture_refusal(e, None, arch)}
            for e in ("sglang", "vllm")}


def _layer_types(config, pts) -> dict[str, str]:
    """{point: the kind of layer that writes it} on hybrid targets (Qwen3-Next, Qwen3.5: linear attention
    between full-attention layers), so a reader sees which captured states come from linear-attention layers;
    {} where every layer is of one kind."""
    kinds = getattr(config, "layer_types", None) or []
    if len(set(kinds)) < 2:
        return {}
    return {p.name: kinds[p.layer] for p in pts if p.kind == "layer" and p.layer < len(kinds)}


def _s(v) -> str:
    return "null" if v is None else str(v)


# --- layers --------------------------------------------------------------------




def run_layers(cfg: LayersConfig) -> None:
    from eaglewire.targets.points import Engine, id_lists, points_from_ids, version_differences

    eng = Engine.parse(cfg.layers_from, cfg.arch or None)
    pts = points_from_ids(cfg.ids, eng, cfg.target_layers)
    res = id_lists(pts, cfg.target_layers)
    res["from"] = {"engine": eng.label(), "ids": cfg.ids, "assumed": eng.assumptions()}
    # how SGLang versions read the given ids, and the classic SGLang ids printed in the table
    sg = res["sglang"] if None not in res["sglang"] else None
    found = [version_differences(cfg.ids, eng, cfg.target_layers),
             sg and version_differences(sg, "sglang", cfg.target_layers)]
    if cfg.arch:  # an engine that cannot capture from this class at all is named, whatever the ids say
        found += [e["refusal"] for e in _engine_support(cfg.arch).values()]
    res["warnings"] = list(dict.fromkeys(w for w in found if w))

    def human(r):
        keys = ["hf_index", "sglang", "sglang_deepseek", "specforge", "vllm", "speculators", "llama.cpp"]
        print(f"reading {r['from']['ids']} as {r['from']['engine']} ids"
              + "".join(f"\n  assumed: {a}" for a in r["from"]["assumed"]))
        print(f"{'point':<16}" + "".join(f"{k:>16}" for k in keys))
        for i, n in enumerate(r["names"]):
            print(f"{n:<16}" + "".join(f"{_s(r[k][i]):>16}" for k in keys))
        for w in r["warnings"]:
            print(f"warning: {w}")

    emit(res, cfg.json, human)


# --- capture -------------------------------------------------------------------




def run_capture(cfg: CaptureConfig) -> None:
    from safetensors.torch import save_file

    from eaglewire.infra.device import resolve_device, resolve_dtype
    from eaglewire.targets.capture import capture
    from eaglewire.targets.chat import apply_chat_template
    from eaglewire.targets.load import load_target
    from eaglewire.targets.points import id_lists, point_option

    dev = resolve_device(cfg.device)
    t = load_target(cfg.target, device=dev, dtype=resolve_dtype(cfg.dtype, dev))
    pts = point_option(cfg.points, t.num_layers)
    if cfg.chat:
        ids = apply_chat_template(t.tokenizer, [{"role": "user", "content": cfg.text}], add_generation_prompt=True,
                                              return_dict=True)["input_ids"]
    else:
        ids = t.tokenizer(cfg.text)["input_ids"]
    if not ids:
        raise EaglewireError("--text: tokenizes to no tokens")
    input_ids = __import__("torch").tensor([ids], device=dev)
    feats = capture(t.model, input_ids, pts)
    tensors = {n: v[0].float().cpu().contiguous() for n, v in feats.items()}
    tensors["input_ids"] = input_ids[0].cpu()
    meta = {"target": cfg.target, "points": json.dumps(id_lists(pts, t.num_layers))}
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(cfg.out), metadata=meta)
    res = {"out": str(cfg.out), "num_tokens": len(ids), "points": [p.name for p in pts],
           "norms": {n: float(v.norm(dim=-1).median()) for n, v in tensors.items() if n != "input_ids"}}
    emit(res, cfg.json, lambda r: print(f"wrote {r['out']}: {r['num_tokens']} tokens x {len(r['points'])} points ({', '.join(r['points'])})"))



def register(app: typer.Typer) -> None:
    build_command(app, "inspect", InspectConfig, run_inspect, "Describe a target and its EAGLE-3 default capture in HF, SGLang and vLLM ids (`layers` converts to the rest).")
    build_command(app, "layers", LayersConfig, run_layers, "Convert layer ids between engines (SGLang, vLLM, HF, ...) via physical names.")
    build_command(app, "capture", CaptureConfig, run_capture, "Capture physically named target tensors for a text into a safetensors file.")
