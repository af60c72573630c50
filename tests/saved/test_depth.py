"""One default depth: every depth eaglewire defaults to is named once, in saved/depth.py, and imported.

The scan reads the AST (nothing imported): a `depth=<int>` keyword, a parameter or field `depth: int = <int>`, or a
module-level `DEPTH`/`*_DEPTH = <int>` anywhere else in src/eaglewire is a second default that can drift.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "eaglewire"
HOME = SRC / "saved" / "depth.py"
# not draft tokens: how deep a JSON nests; a tiny vision tower's layer count
NOT_DRAFT_DEPTHS = {("targets/codecheck.py", "MAX_DEPTH"), ("targets/tiny_families.py", "depth=1")}


def _int(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each depth given as an int literal."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg and n.arg.endswith("depth") and _int(n.value):
            out.append((n.value.lineno, f"{n.arg}={n.value.value}"))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            out += [(d.lineno, f"{p.arg}={d.value}") for p, d in pairs if p.arg.endswith("depth") and _int(d)]
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and _int(n.value):
            if n.target.id.lower().endswith("depth"):
                out.append((n.lineno, f"{n.target.id}: ... = {n.value.value}"))
        elif isinstance(n, ast.Assign) and _int(n.value):
            out += [(n.lineno, f"{t.id} = {n.value.value}") for t in n.targets
                    if isinstance(t, ast.Name) and t.id.upper() == t.id and t.id.endswith("DEPTH")]
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple):  # DEPTH, X = 2, "q8_0"
            for t in n.targets:
                if isinstance(t, ast.Tuple) and len(t.elts) == len(n.value.elts):
                    out += [(n.lineno, f"{e.id} = {v.value}") for e, v in zip(t.elts, n.value.elts)
                            if isinstance(e, ast.Name) and e.id.endswith("DEPTH") and _int(v)]
    return out


def _scan(src: Path) -> list[str]:
    bad = []
    for p in sorted(src.rglob("*.py")):
        if p == HOME:
            continue
        rel = p.relative_to(src).as_posix()
        bad += [f"{rel}:{line}: {what}" for line, what in _literals(ast.parse(p.read_text()))
                if (rel, what.split()[0]) not in NOT_DRAFT_DEPTHS]
    return bad


def test_no_depth_literal_outside_the_one_home():
    assert _scan(SRC) == []


def test_the_scan_finds_each_kind_of_second_default():
    planted = ("def f(depth: int = 4): pass\n"
               "g(depth=3)\n"
               "class C:\n    depth: int = 3\n"
               "DEPTH = 2\n"
               "DEPTH, TYPE = 2, 'q8_0'\n"
               "def ok(depth: int = DEPTH, n: int = 4): pass\n")
    found = sorted(w for _, w in _literals(ast.parse(planted)))
    assert found == sorted(["depth=4", "depth=3", "depth: ... = 3", "DEPTH = 2", "DEPTH = 2"])
