"""Whether a model directory could make outside code run the directory's own code: checked before any engine
or converter sees it.

Why stricter than loading: eaglewire's own loads pass `trust_remote_code=False`,
so custom code there can only be refused, never run. Outside code is not so
careful. llama.cpp's `convert_hf_to_gguf.py` loads a target's tokenizer with
`trust_remote_code=True` for a `HybridDNATokenizer` and for whole families
(DeepSeek-V2, ChatGLM, Qwen, Hunyuan, ...), and with the question on stdin
for any other (`AutoTokenizer.from_pretrained(dir)`): whatever the directory's
`auto_map` names, in any of the configs transformers reads, is imported.
So before a directory is handed over: no `auto_map` (or `custom_pipelines`) at
any depth of those configs, and no tokenizer class that transformers does not
implement itself (such a class exists only as the directory's code).
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

# the configs through which transformers resolves classes (AutoConfig, AutoTokenizer, AutoProcessor, ...)
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                "video_preprocessor_config.json", "image_processor_config.json", "feature_extractor_config.json",
                "generation_config.json")
CODE_KEYS = ("auto_map", "custom_pipelines")  # class references resolved to the directory's .py files
MAX_DEPTH = 64


def _code_key(obj, where: str = "") -> str | None:
    """The dotted path of the first non-empty CODE_KEYS entry anywhere in `obj` (None: there is none)."""
    todo = [(obj, where, 0)]
    while todo:
        node, at, depth = todo.pop()
        if depth > MAX_DEPTH:
            return f"{at} (nested past {MAX_DEPTH} levels, not checkable)"
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            here = f"{at}.{k}" if at else str(k)
            if k in CODE_KEYS and v:
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


def foreign_code(path: Path) -> str | None:
    """Why `path` could make outside code run the directory's own code, or None when it cannot."""
    for name in CONFIG_FILES:
        f = Path(path) / name
        if not f.is_file():
            continue
        try:
            raw = json.loads(f.read_text(errors="strict"))
        except (ValueError, OSError, RecursionError) as e:
            return f"{name} cannot be read to check it for custom code ({type(e).__name__})"
        key = _code_key(raw)
        if key is not None:
            return f"has custom code ({key} in {name})"
        if not isinstance(raw, dict):
            continue
        for cls in _tokenizer_classes(name, raw):
            if not isinstance(cls, str) or not native_tokenizer(cls):
                return (f"tokenizer_class {str(cls)[:60]!r} in {name} is not a tokenizer transformers implements "
                        "(only the directory's own code could be it)")
    return None


def refuse_foreign_code(path: Path, who: str) -> Path:
    """`path` itself, or one line naming what in it is code `who` (the outside program) would run."""
    why = foreign_code(path)
    if why is not None:
        raise EaglewireError(f"{path}: {why}; {who} could run it, and eaglewire never runs model code "
                             "(use a target that transformers supports natively)")
    return path
