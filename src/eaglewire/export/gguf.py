"""`export --format gguf`: a drafter (and, on request, its target) as GGUF files llama.cpp serves.

Why through llama.cpp's own converter: the GGUF tensor names, the q/k row
permutation for llama.cpp's rope, the absolute `d2t` and the `eagle3.*`
metadata are llama.cpp's to define, and its `convert_hf_to_gguf.py` (from the
same pinned tree the server is built from) is where they are defined. What is
ours is the one thing the converter copies blindly: the layer ids. It writes
`eagle_aux_hidden_state_layer_ids` from the drafter's config into
`target_layers` as they are, and llama.cpp reads id k as the *input* of layer k.
So the staged config carries ids computed for llama.cpp from the recorded
physical points (`targets/points.py`), never the ids of another engine's export.

Why the converter is fenced in: it is outside code that loads a target's
tokenizer with `trust_remote_code=True` for some tokenizers and families, and
with the question on stdin for the rest. So every directory it gets passes
eaglewire's own checks first (`targets/codecheck.py`: no `auto_map`, no
tokenizer class transformers does not implement), and it runs with stdin
closed, offline, from a directory of ours, under a guard that makes
transformers' import of a model directory's module fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from eaglewire.drafter import DrafterConfig
from eaglewire.engines import llama_env
from eaglewire.infra.atomic import owned_tmpdir
from eaglewire.infra.children import child_env, run_child
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.weights import check_exported
from eaglewire.targets.codecheck import refuse_foreign_code
from eaglewire.targets.load import cache_dir, checked_dir, default_gguf, resolve_target_dir
from eaglewire.targets.points import Engine, Point, ids_for_points
from eaglewire.targets.support import capture_refusal

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
DRAFTER_FILE = "drafter.gguf"
LLAMA_CPP = Engine.parse("llama.cpp")
ID_KEY = "eagle3.target_layers (GGUF metadata, from eagle_aux_hidden_state_layer_ids)"
CONVERTER = "llama.cpp's convert_hf_to_gguf.py"

# Run before the converter in its interpreter: transformers' loader of a model directory's own module (and the
# copy that precedes it) refuses, and a question about custom code is answered no at once. Our checks refuse such
# a directory first; this holds if one is ever missed.
GUARD = """
import os, runpy, sys
import transformers.dynamic_module_utils as _d
def _refuse(*a, **k):
    raise SystemExit("eaglewire: refused to import a model directory's own code: " + repr(a[:2])[:200])
_d.get_cached_module_file = _d.get_class_in_module = _refuse
_d.TIME_OUT_REMOTE_CODE = 0
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
"""


# llama.cpp 0.3.36 feeds an EAGLE-3 drafter the target's layer inputs only from the graphs that mark them
# (`res->t_layer_inp[il] = inpL`: src/models/llama.cpp, qwen3.cpp, qwen3moe.cpp, openai-moe.cpp, minimax-m2.cpp,
# qwen3next.cpp, qwen35.cpp, qwen35moe.cpp). On any other graph the first decode aborts in src/llama-graph.cpp:
# GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null"). The HF class -> graph is the
# converter's registration (conversion/*.py `ModelBase.register`, `model_arch`).
# The served classes whose graph does not mark them: {class: llama.cpp graph}.
def arch_refusal(arch: str | None) -> str | None:
    """Why llama.cpp cannot feed an EAGLE-3 drafter from a target of class `arch` (None: it can, or not known):
    the per-class facts live with every engine's in `targets.support`."""
    return capture_refusal("llama.cpp", None, arch)


def refusals(cfg: DrafterConfig, points: list[Point], num_layers: int, arch: str | None = None) -> list[str]:
    """Why llama.cpp cannot serve this drafter as trained (empty: it can); read from its eagle3 model and loader,
    and, when the target's class is known, from the target's graph."""
    why = [r] if (r := arch_refusal(arch)) else []
    ids = ids_for_points(points, LLAMA_CPP, num_layers)
    bad = [p.name for p, i in zip(points, ids) if i is None]
    if bad:
        why.append(f"llama.cpp has no layer id for {', '.join(bad)} (it captures layer inputs 0..L-1 only; the last "
                   "layer's output and the final norm are not extracted on llama targets)")
    if cfg.num_aux != 3:
        why.append(f"llama.cpp's EAGLE-3 requires exactly 3 target layers; the drafter has {cfg.num_aux} feature slots")
    for flag in ("norm_before_fc", "norm_output"):
        if getattr(cfg, flag):
            why.append(f"llama.cpp 0.3.36's converter and eagle3 graph read no {flag}; the drafter was trained with it")
    if cfg.fc_norm:
        why.append("llama.cpp has no per-slot fc_norm (only one norm over the fused features, norm_before_fc); "
                   "the drafter was trained with fc_norm")
    if cfg.num_layers != 1:
        why.append(f"llama.cpp's converter recognises an EAGLE-3 drafter by one decoder layer; the drafter has {cfg.num_layers}")
    return why


def llama_ids(cfg: DrafterConfig, points: list[Point], num_layers: int, where: str,
              arch: str | None = None) -> list[int]:
    why = refusals(cfg, points, num_layers, arch)
    if why:
        raise EaglewireError(f"{where}: cannot export for llama.cpp: " + "; ".join(why))
    return [int(i) for i in ids_for_points(points, LLAMA_CPP, num_layers)]


def check_type(name: str, value: str) -> str:
    v = value.lower()
    if v not in GGUF_TYPES:
        raise EaglewireError(f"{name} {value!r}: expected one of {', '.join(GGUF_TYPES)}")
    return v


def checked_for_converter(d: Path) -> Path:
    """`d` once it is safe to hand to llama.cpp's converter: eaglewire's target checks and no code it would run."""
    return checked_dir(refuse_foreign_code(d, CONVERTER))


def target_dir_for(source: str, num_layers: int, where: str) -> Path:
    """The target's HF directory the converter reads (tokenizer, vocab and layer count), checked against the drafter."""
    d = checked_for_converter(resolve_target_dir(source))
    try:
        tc = json.loads((d / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise EaglewireError(f"{d / 'config.json'}: unreadable ({e})") from e
    tc = {**tc, **tc.get("text_config", {})} if isinstance(tc.get("text_config"), dict) else tc
    if tc.get("num_hidden_layers") != num_layers:
        raise EaglewireError(f"{where}: the drafter was trained on a {num_layers}-layer target, but {d} has "
                             f"{tc.get('num_hidden_layers')} layers: pass the right --target")
    return d


def converter_command(script: Path, args: list[str]) -> list[str]:
    """The converter under GUARD; `-P`: the working directory is not on its import path."""
    return [sys.executable, "-P", "-c", GUARD, str(script), *args]


def run_converter(script: Path, args: list[str], timeout: int, cwd: Path) -> subprocess.CompletedProcess:
    """The converter as a fenced child: stdin closed, offline, in `cwd` (ours), its group killed with us."""
    env = child_env({"PYTHONPATH": os.pathsep.join(p for p in (str(llama_env.gguf_py()), os.environ.get("PYTHONPATH", ""))
                                                    if p)})
    env.pop("NO_LOCAL_GGUF", None)  # its own gguf-py, not our pinned PyPI gguf (which predates EAGLE3)
    return run_child(converter_command(script, args), timeout, env=env, cwd=cwd)


def convert(model_dir: Path, out_file: Path, outtype: str, target_dir: Path | None = None,
            timeout: int = 1800) -> Path:
    """Run llama.cpp's convert_hf_to_gguf.py (pinned tree) on an HF directory; one line on failure.

    `model_dir` is a target (checked as one) or a staged drafter of ours (no target_dir given then: checked
    for code only); both pass before the converter is even unpacked."""
    if target_dir is None:
        checked_for_converter(model_dir)
    else:
        refuse_foreign_code(model_dir, CONVERTER)
        checked_for_converter(target_dir)
    src = llama_env.ensure_source()
    # absolute: the converter runs in out_file's directory, where a path relative to ours names nothing
    args = [str(Path(model_dir).resolve()), "--outfile", str(Path(out_file).resolve()), "--outtype", outtype]
    if target_dir is not None:
        args += ["--target-model-dir", str(Path(target_dir).resolve())]
    try:
        r = run_converter(src / "convert_hf_to_gguf.py", args, timeout, out_file.parent)
    except subprocess.TimeoutExpired as e:
        raise EaglewireError(f"llama.cpp's converter on {model_dir} took over {timeout} s") from e
    if r.returncode != 0 or not out_file.is_file():
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise EaglewireError(f"llama.cpp's convert_hf_to_gguf.py failed on {model_dir} (exit {r.returncode}): {tail}")
    return out_file


def check_range(tensors: dict[str, torch.Tensor], outtype: str, where: str) -> None:
    """The drafter's weights as the converter writes them (`outtype` for every matrix, f32 for 1-D tensors),
    finite and in range, before anything is written: f16 turns a finite 1e5 into inf without a word."""
    check_exported(tensors, outtype, where, narrowed_min_dims=2)


def target_gguf(source: str, outtype: str) -> Path:
    """The target as GGUF, converted once per type and cached (the shipped default target is a Q4_1 GGUF already)."""
    if outtype == "q4_1" and source == "default":
        return default_gguf()
    outtype = check_type("--target-gguf", outtype)
    d = resolve_target_dir(source)
    out = cache_dir() / "gguf" / f"{d.name}-{outtype}.gguf"
    if out.is_file():
        return out
    checked_for_converter(d)
    out.parent.mkdir(parents=True, exist_ok=True)
    with owned_tmpdir(out.parent, ".convert-") as tmp:  # a killed run's is removed by the next
        part = convert(d, tmp / out.name, outtype)
        part.rename(out)  # whole or absent: a killed conversion never leaves a truncated cached file
    return out


def write_drafter(stage: Path, out_file: Path, outtype: str, target_dir: Path) -> Path:
    """Convert a staged vLLM-layout directory (config ids already llama.cpp's) into `out_file`."""
    return convert(stage, out_file, outtype, target_dir)
