"""Whether a model directory could make a loader run the directory's own code: checked before anything
(eaglewire's own loading, an engine, a converter) reads it.

One check, two strengths, after who reads the directory next:
- `strict` (llama.cpp's `convert_hf_to_gguf.py`): it loads a target's
  tokenizer with `trust_remote_code=True` for a `HybridDNATokenizer` and for
  whole families (DeepSeek-V2, ChatGLM, Qwen, Hunyuan, ...), and with the
  question on stdin for any other (`AutoTokenizer.from_pretrained(dir)`):
  whatever the directory's `auto_map` names, in any of the configs
  transformers reads, is imported. So: no `auto_map` (or `custom_pipelines`)
  at any depth of those configs, and no tokenizer class that transformers
  does not implement itself (such a class exists only as the directory's code).
- not strict (eaglewire's own loads, and vLLM as eaglewire starts it): both
  pass `trust_remote_code=False` (a vLLM command with `--trust-remote-code`
  is refused in engines/vllm_server.py), so transformers resolves a config's
  classes natively or refuses, and never imports the directory's `.py`. Published
  checkpoints of families transformers implements ship an `auto_map` anyway
  (Kimi-K2.5, Kimi-K2, DeepSeek-V3): that is accepted when `config.json`'s
  model type is native and every class each `auto_map` names, at any depth of
  the configs the reader resolves, is one transformers implements
  (`families.native_model_type`). A tokenizer_config.json whose `auto_map`
  names only a tokenizer family eaglewire reads natively, with that family's
  file present (Kimi's `TikTokenTokenizer` and `tiktoken.model`:
  targets/tokenizers.py), is accepted too: eaglewire converts it, and vLLM is
  started with `--tokenizer` on the converted copy (engines/vllm_server.py), so
  neither reads the code. Code for anything else stays refused. vLLM 0.32.0 builds those configs from its own
  registry too (vllm/transformers_utils/config.py `_CONFIG_REGISTRY`:
  `kimi_k2`, `kimi_k25`, `deepseek_v32`, then sets `trust_remote_code =
  False`). Only model types whose vLLM code forces `trust_remote_code=True`
  regardless stay refused (VLLM_TRUSTS_CODE).
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets import tokenizers

# the configs through which transformers resolves classes (AutoConfig, AutoTokenizer, AutoProcessor, ...)
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                "video_preprocessor_config.json", "image_processor_config.json", "feature_extractor_config.json",
                "generation_config.json")
CODE_KEYS = ("auto_map", "custom_pipelines")  # class references resolved to the directory's .py files
MAX_DEPTH = 64
# vLLM 0.32.0 model types whose code loads with trust_remote_code=True whatever the command says
# (vllm/transformers_utils/processors/muse_glimmer.py: `AutoProcessor.from_pretrained(hf_dir, trust_remote_code=True)`)
VLLM_TRUSTS_CODE = frozenset({"muse_glimmer", "muse_glimmer_text", "muse_glimmer_vision", "muse_glimmer_assistant"})


def read_config(p: Path) -> tuple[object, str | None]:
    """(parsed JSON or None when absent, why it cannot be read or None): the one tolerant reader of a config."""
    try:
        return (json.loads(Path(p).read_text(errors="strict")) if Path(p).is_file() else None), None
    except (ValueError, OSError, RecursionError) as e:
        return None, type(e).__name__


def json_or_none(p: Path):
    """`p` parsed, or None when absent or unreadable (named by whoever reads it next)."""
    return read_config(p)[0]


def _code_key(obj, where: str = "", native=None) -> str | None:
    """The dotted path of the first non-empty CODE_KEYS entry anywhere in `obj` (None: there is none), skipping
    auto_maps for which `native(auto_map)` is true."""
    todo = [(obj, where, 0)]
    while todo:
        node, at, depth = todo.pop()
        if depth > MAX_DEPTH:
            return f"{at} (nested past {MAX_DEPTH} levels, not checkable)"
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            here = f"{at}.{k}" if at else str(k)
            if k in CODE_KEYS and v and not (k == "auto_map" and native is not None and native(v)):
                return here
            if isinstance(v, (dict, list)):
                todo.append((v, here, depth + 1))
    return None


def _tokenizer_classes(name: str, raw: dict) -> list[str]:
    """Tokenizer class names a config asks for (its own and a nested text config's)."""
    out = [raw.get("tokenizer_class")]
    if name == "config.json":
        out += [sub.get("tokenizer_class") for sub in raw.values() if isinstance(sub, dict)]
    return [c for c in out if c is not None]


def native_tokenizer(name: str) -> bool:
    """Whether transformers implements tokenizer class `name` itself (the lookup AutoTokenizer makes)."""
    from transformers.models.auto import tokenization_auto  # lazy: the CLI imports no torch

    tokenizer_class_from_name = tokenization_auto.tokenizer_class_from_name

    if not name.isidentifier():
        return False
    try:
        return tokenizer_class_from_name(name) is not None or tokenizer_class_from_name(name + "Fast") is not None
    except Exception:  # noqa: BLE001  a name transformers cannot import is not one it implements
        return False


def _native_type(raw: object) -> bool:
    """Whether config.json names a model type transformers implements (and no engine forces code for)."""
    from eaglewire.targets import families  # lazy: families imports torch; the CLI must not

    mt = raw.get("model_type") if isinstance(raw, dict) else None
    return mt not in VLLM_TRUSTS_CODE and families.native_model_type({"model_type": mt}) is not None


def _tokenizer_native(path: Path, native):
    """`native`, widened to a tokenizer auto_map naming a family `tokenizers` reads from files `path` has."""
    if tokenizers.family_of(path) is None:
        return native
    return lambda m: tokenizers.family_of_auto_map(m) is not None or (native is not None and native(m))


def foreign_code(path: Path, strict: bool = True, files: tuple[str, ...] = CONFIG_FILES) -> str | None:
    """Why `path` could make its next reader run the directory's own code, or None when it cannot
    (`strict`: the reader trusts code; not strict: it passes trust_remote_code=False, see the module doc).
    `files`: the configs that reader resolves classes from."""
    raw_config, _ = read_config(Path(path) / "config.json")
    native = None
    if not strict and _native_type(raw_config):
        from eaglewire.targets import families  # lazy: families imports torch; the CLI must not

        mt = raw_config["model_type"]
        native = lambda m: families.native_model_type({"model_type": mt, "auto_map": m}) is not None  # noqa: E731
    for name in files:
        raw, unreadable = read_config(Path(path) / name)
        if unreadable is not None and strict:
            return f"{name} cannot be read to check it for custom code ({unreadable})"
        key = _code_key(raw, native=_tokenizer_native(path, native) if name == "tokenizer_config.json" and
                        not strict else native)
        if key is not None:
            return f"has custom code ({key} in {name})"
        if not (strict and isinstance(raw, dict)):
            continue
        for cls in _tokenizer_classes(name, raw):
            if not isinstance(cls, str) or not native_tokenizer(cls):
                return (f"tokenizer_class {str(cls)[:60]!r} in {name} is not a tokenizer transformers implements "
                        "(only the directory's own code could be it)")
    return None


def refuse_foreign_code(path: Path, who: str | None = None, *, strict: bool = True,
                        files: tuple[str, ...] = CONFIG_FILES) -> Path:
    """`path` itself, or one line naming what in it is code `who` (an outside program; None: eaglewire) would run."""
    why = foreign_code(path, strict, files)
    if why is not None:
        runs = f"{who} could run it, and " if who else ""
        raise EaglewireError(f"{path}: {why}; {runs}eaglewire never runs model code "
                             "(use a target that transformers supports natively)")
    return path
