"""The engine registry is the one place engine facts live: the readers agree with it, and no module keeps a
second copy (a typed-out list of engines, a pinned release spelled again)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from eaglewire.doctor import engine_config
from eaglewire.engines import llama_env, vllm_env
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.formats import FORMATS, ID_ENGINE
from eaglewire.serve.config import ServeConfig
from eaglewire.targets import registry
from eaglewire.targets.points import Engine
from eaglewire.targets.registry import SPECS, engine_spec, pinned_version
from eaglewire_testing import engine_code

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "eaglewire"
# every way an engine is named in code: its names, other spellings and the id rules they dispatch to
NAMES = frozenset(registry.ENGINES) | {a for s in SPECS for a in (s.rule, *s.spellings)}


def _accepted(name: str) -> bool:
    try:
        Engine.parse(name)
    except EaglewireError:
        return False
    return True


def test_the_names_engine_parse_accepts_are_the_registry_names():
    probes = NAMES | {"sglang-new", "llama_cpp", "tgi", "sglang==0.5.23", "VLLM", ""}
    accepted = {p.partition("==")[0].lower() for p in probes if _accepted(p)}
    assert accepted == set(registry.ENGINES)
    for s in SPECS:  # each spelling is the engine, and an engine outside a family reads by its rule
        assert all(engine_spec(alt) is s for alt in (s.name, s.name.upper(), f"{s.name}==1.0", *s.spellings))
        assert Engine(s.name).rule == s.rule
    assert engine_spec("tgi") is None and pinned_version("tgi") is None


def test_each_pinned_version_is_the_one_built_and_downloaded(monkeypatch, tmp_path):
    assert vllm_env.VLLM_VERSION == pinned_version("vllm") == pinned_version("speculators")
    assert vllm_env.PACKAGE == f"{engine_spec('vllm').package}=={pinned_version('vllm')}"
    assert llama_env.LLAMA_CPP_PYTHON == pinned_version("llama.cpp") == pinned_version("llamacpp")
    assert pinned_version("specforge") == pinned_version("sglang") == Engine("sglang").assumed_version
    assert Engine("llama.cpp").assumed_version is None  # its ids name no release: labels stay "llama.cpp"
    # what engine_code downloads when no version is named: the pinned package, at the pinned release
    monkeypatch.setattr("eaglewire.targets.load.cache_dir", lambda: tmp_path)
    asked = []

    def fake_pip(cmd, **kw):
        asked.append(cmd[-1])
        (Path(cmd[cmd.index("-d") + 1]) / "x.whl").write_bytes(b"")
        return type("R", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(engine_code.subprocess, "run", fake_pip)
    for eng in engine_code.DIST:
        engine_code.wheel(eng)
    assert asked == [f"{engine_spec(e).package}=={pinned_version(e)}" for e in engine_code.DIST]


def test_formats_read_are_the_formats_written_plus_gguf():
    read = {f for s in SPECS for f in s.formats}
    assert read == set(FORMATS) | {"gguf"}
    for fmt in FORMATS:  # the engine whose meaning a format's ids have loads that format
        assert fmt in engine_spec(ID_ENGINE[fmt]).formats, fmt


def test_serve_and_doctor_offer_the_registry_engines():
    choices = next(f for f in dataclasses.fields(ServeConfig) if f.name == "engine").metadata["choices"]
    assert choices == registry.SERVE_ENGINES and choices[0] == registry.DEFAULT_ENGINE
    assert {c for c in choices if engine_spec(c).runs_here} == {"vllm", "llama.cpp"}
    assert engine_config.ENGINES == tuple(s.name for s in SPECS if s.doctor_config)
    assert registry.ORDERED_ENGINES == {"hf", "llamacpp"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _copies(tree: ast.AST) -> list[tuple[int, str]]:
    """Second copies of registry facts in one module: (line, what)."""
    pins, docs = set(registry.PINNED.values()), _docstrings(tree)
    module_level = {id(n.value) for n in getattr(tree, "body", []) if isinstance(n, (ast.Assign, ast.AnnAssign))}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and n.value in pins and id(n) not in docs:
            out.append((n.lineno, f"pinned release {n.value!r} spelled out"))
        elif isinstance(n, ast.Subscript | ast.Attribute) and getattr(n.value, "id", None) == "PINNED":
            out.append((n.lineno, "PINNED read directly (ask registry.pinned_version)"))
        elif isinstance(n, ast.Tuple | ast.List | ast.Set | ast.Call):
            elts = n.args[0].elts if (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Set | ast.Tuple)
                                      and getattr(n.func, "id", "") in ("frozenset", "set", "tuple")) else \
                getattr(n, "elts", [])
            names = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in NAMES]
            if set(names) <= set(FORMATS):  # a list of layouts (saved/formats.py's names), not of engines
                continue
            if len(names) == len(elts) and (len(names) >= 3 or (len(names) == 2 and id(n) in module_level)):
                out.append((n.lineno, f"engine list {names} typed out"))
    return sorted(out)


def _may_copy(text: str) -> bool:
    """Cheap text test first: only a module naming PINNED, a pin or two engines is parsed."""
    return ("PINNED" in text or any(v in text for v in registry.PINNED.values())
            or sum(f'"{n}"' in text or f"'{n}'" in text for n in NAMES) >= 2)


def test_no_module_keeps_a_second_copy_of_the_registry():
    texts = {p: p.read_text() for p in sorted(SRC.rglob("*.py")) if p.name != "registry.py"}
    found = [f"{p.relative_to(SRC)}:{line}: {what}" for p, text in texts.items() if _may_copy(text)
             for line, what in _copies(ast.parse(text))]
    assert found == []


def test_the_scan_finds_what_it_forbids():
    bad = ('VLLM = PINNED["vllm"]\nFACTS = {"0.32.0": 1}\nENGINES = ("sglang", "llama.cpp")\n'
           'ORDERED = frozenset({"hf", "llamacpp"})\ndef f():\n    """Pinned at 0.32.0."""\n'
           '    return [x for x in ("sglang", "vllm", "llama.cpp")], ("vllm", "speculators"), ("sglang", "vllm", "eagle")\n')
    got = _copies(ast.parse(bad))  # on line 7 a pair inside a function and a list of layouts pass
    assert [line for line, _ in got] == [1, 2, 3, 4, 7], got
