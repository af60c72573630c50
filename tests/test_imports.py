"""The house rules of `src/eaglewire`, read from its imports (AST, nothing imported).

- a room imports only rooms above it in the README's Layout list (the order is read from the README, so the two
  cannot drift), and each room's `__init__` docstring says what it owns and which rooms it may import, exactly
  the rooms it does import;
- no import cycle between top-level folders (a room depends on rooms below it only);
- no module imports another module's private (`_name`) names;
- nothing outside a `cli.py` imports a `cli.py` (commands are entry points, not libraries);
- imports inside functions only in `cli.py` (lazy CLI startup) and `__main__` blocks, plus at most
  MAX_LAZY others, each with a comment on its line saying why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "eaglewire"
MAX_LAZY = 20


def _module(p: Path) -> str:
    parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(SRC.rglob("*.py"))}


def _room(mod: str) -> str:
    parts = mod.split(".")
    package = len(parts) == 2 and MODULES.get(mod, SRC).name == "__init__.py"  # `from eaglewire.drafter import X`
    return parts[1] if len(parts) > 2 or package else "(top)"  # eaglewire.cli, eaglewire.flags_doc: the top room


def _parents(tree: ast.AST) -> dict:
    return {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}


def _enclosing(node, parents) -> tuple[bool, bool]:
    """(inside a function, inside an `if __name__ == "__main__":` block)"""
    in_func = in_main = False
    while node in parents:
        node = parents[node]
        in_func |= isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        in_main |= isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
    return in_func, in_main


def _imports():
    """(module, line, imported module, names or None, in function, in __main__, source line) for every import."""
    for mod, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        parents = _parents(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    yield mod, n.lineno, a.name, None, *_enclosing(n, parents), lines[n.lineno - 1]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - n.level + 1] + ([n.module] if n.module else []))
                yield mod, n.lineno, base, [a.name for a in n.names], *_enclosing(n, parents), lines[n.lineno - 1]


IMPORTS = list(_imports())


def _targets(base: str, names) -> list[str]:
    """The project modules an import statement reaches (a `from pkg import module` names the module)."""
    out = [base] if base in MODULES else []
    for name in names or ():
        if f"{base}.{name}" in MODULES:
            out.append(f"{base}.{name}")
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def _edges(level) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for mod, _, base, names, *_ in IMPORTS:
        for t in _targets(base, names):
            a, b = level(mod), level(t)
            if a != b:
                g.setdefault(a, set()).add(b)
    return g


def test_the_scan_sees_the_whole_package():
    assert len(MODULES) > 50 and "eaglewire.targets.points" in MODULES
    assert any(base == "eaglewire.targets.points" for _, _, base, *_ in IMPORTS)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_folders():
    assert _cycles(_edges(_room)) == []


def test_no_import_cycle_between_modules():
    assert _cycles(_edges(lambda m: m)) == []


def test_no_private_name_is_imported_from_another_module():
    bad = [f"{mod}:{line}: {base}.{n}" for mod, line, base, names, *_ in IMPORTS
           for n in names or () if n.startswith("_") and not n.startswith("__") and base.startswith("eaglewire")
           and base != mod]
    assert bad == []


def test_no_library_module_imports_a_command_module():
    bad = [f"{mod}:{line}: {t}" for mod, line, base, names, _, in_main, _ in IMPORTS
           for t in _targets(base, names)
           if (t.endswith(".cli") or t == "eaglewire.cli") and not MODULES[mod].name == "cli.py" and not in_main]
    assert bad == []


def test_imports_inside_functions_are_few_and_each_says_why():
    lazy = [(mod, line, src) for mod, line, _, _, in_func, in_main, src in IMPORTS
            if in_func and not in_main and MODULES[mod].name != "cli.py"]
    assert len(lazy) <= MAX_LAZY, [f"{m}:{n}" for m, n, _ in lazy]
    unexplained = [f"{m}:{n}: {s.strip()}" for m, n, s in lazy if "#" not in s]
    assert unexplained == []


@pytest.mark.parametrize("room", ["targets", "drafter"])
def test_the_lowest_rooms_import_no_pipeline_stage(room):
    """The target and the drafter model are what every stage builds on: they import none of the stages."""
    stages = {"data", "training", "decoding", "doctor", "export", "serve", "demo", "plan", "engines"}
    assert not (_edges(_room).get(room, set()) & stages)


README = SRC.parents[1] / "README.md"
TOP = "(top)"


def _readme_order(text: str) -> list[str]:
    """The rooms of the README's Layout block, top of the list first (`cli.py` and `flags_doc.py`: the top room)."""
    block = text.split("```\nsrc/eaglewire/\n", 1)[1].split("```", 1)[0]
    rooms = [line.split("/")[0].strip() for line in block.splitlines() if re.match(r"  \w+/ ", line)]
    return rooms + [TOP]


ORDER = _readme_order(README.read_text())


def _upward(edges: dict[str, set[str]], order: list[str]) -> list[str]:
    """Each import from a room to a room below it in `order` (a later one), or to a room the order does not name."""
    return [f"{a} -> {b}" for a, bs in sorted(edges.items()) for b in sorted(bs)
            if a not in order or b not in order or order.index(b) > order.index(a)]


def test_the_readme_names_every_room_once():
    rooms = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))
    assert sorted(ORDER[:-1]) == rooms and len(set(ORDER)) == len(ORDER)


def test_the_order_check_sees_an_upward_import():
    assert _upward({"b": {"a"}}, ["a", "b"]) == []
    assert _upward({"a": {"b"}, "b": {"c"}}, ["a", "b"]) == ["a -> b", "b -> c"]


def test_a_room_imports_only_rooms_above_it_in_the_readme():
    """The house can be read from the bottom up: each room is understood from the rooms above it alone."""
    assert _upward(_edges(_room), ORDER) == []


def _may_import(doc: str) -> set[str]:
    m = re.search(r"^May import: (.+?)\.?$", doc, re.M)
    assert m, "no 'May import: ...' line"
    named = m.group(1).strip()
    return set() if named.startswith("nothing") else {r.strip() for r in named.split(",")}


@pytest.mark.parametrize("room", ORDER[:-1])
def test_each_room_says_what_it_owns_and_may_import(room):
    doc = ast.get_docstring(ast.parse((SRC / room / "__init__.py").read_text())) or ""
    assert doc.strip() and len(doc.splitlines()[0]) > 20, f"{room}/__init__.py: no docstring saying what it owns"
    assert _may_import(doc) == _edges(_room).get(room, set()) - {TOP}, f"{room}/__init__.py: its 'May import' line"
