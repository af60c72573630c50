"""Run the engines' own code, from their pinned PyPI wheels, against stub models.

Why: our id rules were once written by reading engine source, and one came out
inverted. A rule about an engine is trusted here only when that engine's own
lines produced it. Neither SGLang nor vLLM can run on this CPU machine as a
runtime (SGLang needs CUDA kernels), but the methods that decide the capture
are plain Python: we compile each one straight from the wheel's source file
(same file name and line numbers in tracebacks) and run it on a stub `self`.
Names the method needs from its module resolve to permissive mocks, so what
the method computes is the engine's own logic and nothing else.

The versions and packages come from the engine registry (`eaglewire.targets.registry`);
bumping a pin there makes these tests download and execute the new release.
"""

from __future__ import annotations

import ast
import builtins
import copy
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.registry import engine_spec, pinned_version

DIST = {e: engine_spec(e).package for e in ("sglang", "vllm")}  # the engines that ship a Python wheel to read


def wheel(engine: str, version: str | None = None) -> Path:
    """The engine's wheel at `version` (None: the pinned one), downloaded once (no dependencies: nothing is
    installed or imported)."""
    from eaglewire.targets.load import cache_dir

    version = version or pinned_version(engine)
    d = cache_dir() / "engine-wheels" / f"{engine}-{version}"
    found = sorted(d.glob("*.whl"))
    if found:
        return found[0]
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
           "--python-version", "3.11", "-d", str(d), f"{DIST[engine]}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = sorted(d.glob("*.whl"))
    if r.returncode != 0 or not found:
        raise EaglewireError(f"could not download {DIST[engine]}=={version}: {r.stderr.strip()[-400:]}")
    return found[0]


def sources(whl: Path, prefix: str) -> dict[str, str]:
    """Module path (inside the wheel) -> source text, for every .py under `prefix`."""
    with zipfile.ZipFile(whl) as z:
        return {n: z.read(n).decode() for n in z.namelist() if n.startswith(prefix) and n.endswith(".py")}


def soft(name: str) -> mock.MagicMock:
    """A MagicMock that also compares (always False) and unpacks into two, as runtime objects do."""
    m = mock.MagicMock(name=name)
    for op in ("__lt__", "__gt__", "__le__", "__ge__"):
        getattr(m, op).return_value = False
    m.__iter__.side_effect = lambda: iter((mock.MagicMock(), mock.MagicMock()))
    return m


class Permissive(dict):
    """Module globals: builtins as usual, any other missing name a soft MagicMock named after it."""

    make = staticmethod(soft)

    def __missing__(self, key):
        if hasattr(builtins, key):
            return getattr(builtins, key)
        v = self.make(key)
        self[key] = v
        return v


_IMPORTS: dict[str, list] = {}


def _stdlib_imports(filename: str, src: str) -> list:
    """The module's standard-library imports: they run for real (itertools.islice must iterate)."""
    if filename not in _IMPORTS:
        _IMPORTS[filename] = [n for n in ast.parse(src).body if isinstance(n, (ast.Import, ast.ImportFrom)) and all(
            (getattr(n, "module", None) or a.name).split(".")[0] in sys.stdlib_module_names for a in n.names)
            and not getattr(n, "level", 0)]
    return copy.deepcopy(_IMPORTS[filename])


def compile_function(src: str, filename: str, fn: ast.FunctionDef, env: dict | None = None,
                     scope: type[Permissive] = Permissive):
    """The function `fn` of `src`, compiled on its own (decorators and annotations dropped).

    `scope` supplies the names the module would have (a Permissive subclass may mock them otherwise)."""
    node = copy.deepcopy(fn)
    node.decorator_list = []
    node.returns = None
    for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
        a.annotation = None
    for a in (node.args.vararg, node.args.kwarg):
        if a is not None:
            a.annotation = None
    mod = ast.fix_missing_locations(ast.Module(body=[*_stdlib_imports(filename, src), node], type_ignores=[]))
    ns = scope(env or {})
    ns["__name__"] = filename
    exec(compile(mod, filename, "exec"), ns)
    return ns[node.name]


# --- the model classes of a package ------------------------------------------------


@dataclass
class ClassInfo:
    module: str
    name: str
    node: ast.ClassDef
    bases: list[str]
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)
    base_exprs: list[str] = field(default_factory=list)  # as written: `llama.LlamaForCausalLM`


# The platforms a package's `if current_platform.is_cuda(): from .nvidia... else: ...` can select.
PLATFORMS = ("cuda", "rocm", "xpu", "cpu", "tpu")


def _platform_test(node: ast.expr, platform: str | None, typing: bool = False) -> bool | None:
    """The truth of an import guard on `platform` (None: not a platform test, or no platform given)."""
    if isinstance(node, ast.Name) and node.id == "TYPE_CHECKING":
        return typing  # what runs, unless asked what the type checker sees
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _platform_test(node.operand, platform, typing)
        return None if v is None else not v
    if isinstance(node, ast.BoolOp):
        vals = [_platform_test(v, platform, typing) for v in node.values]
        if None in vals:
            return None
        return any(vals) if isinstance(node.op, ast.Or) else all(vals)
    if platform is None:
        return None
    text = ast.unparse(node)
    m = re.fullmatch(r"current_platform\.is_(cuda_alike|cuda|rocm|xpu|cpu|tpu)\(\)", text)
    if m:
        return platform in ("cuda", "rocm") if m.group(1) == "cuda_alike" else platform == m.group(1)
    m = re.fullmatch(r"current_platform\.device_type == ['\"](\w+)['\"]", text)
    return platform == m.group(1) if m else None


@dataclass
class Package:
    """Classes, imports and registered entry classes of the model modules in a wheel.

    `imports` maps, per module, a local name to the module it was imported from;
    `bindings` also keeps the name it has there (`from .a import B as C`: C -> (a, B)),
    so a class re-exported by a package `__init__` or renamed on import still resolves.
    Imports under a platform guard follow `platform` (None: every branch, the last one winning).
    """

    src: dict[str, str]
    classes: dict[tuple[str, str], ClassInfo] = field(default_factory=dict)
    imports: dict[str, dict[str, str]] = field(default_factory=dict)
    entries: list[tuple[str, str]] = field(default_factory=list)
    bindings: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    platform: str | None = None
    package: str = ""
    loaded: set[str] = field(default_factory=set)

    @staticmethod
    def parse(src: dict[str, str], package: str, platform: str | None = None, lazy: bool = False) -> Package:
        """`lazy`: parse a module only when a lookup reaches it (vLLM's wheel holds 13 MB of models)."""
        pk = Package(src, platform=platform, package=package)
        for path in [] if lazy else src:
            pk.load(path)
        return pk

    def load(self, path: str) -> None:
        if path in self.loaded or path not in self.src:
            return
        self.loaded.add(path)
        tree = ast.parse(self.src[path])
        top: dict[str, tuple[str, str]] = {}
        self._bind(tree.body, path, self.package, top, lazy=False)
        lazy: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):  # imports inside functions count: models import lazily
            if isinstance(node, ast.FunctionDef):
                self._bind(node.body, path, self.package, lazy, lazy=True)
        typed: dict[str, tuple[str, str]] = {}  # `if TYPE_CHECKING:` names a module __getattr__ serves
        self._bind(tree.body, path, self.package, typed, lazy=False, typing=True)
        self.bindings[path] = {**typed, **lazy, **top}
        self.imports[path] = {k: m for k, (m, _n) in self.bindings[path].items()}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                exprs = [ast.unparse(b) for b in node.bases]
                ci = ClassInfo(path, node.name, node, [e.split(".")[-1] for e in exprs], base_exprs=exprs)
                ci.methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
                self.classes[(path, node.name)] = ci
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                vals = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                self.entries += [(path, ast.unparse(v)) for v in vals]

    def module_path(self, dotted: str, level: int, here: str) -> str:
        """The wheel path of module `dotted` imported from `here` (a package's is its __init__.py)."""
        if level:
            parts = here.split("/")[:-1]
            parts = parts[:len(parts) - (level - 1)] if level > 1 else parts
            dotted = ".".join([*parts, *([dotted] if dotted else [])])
        base = dotted.replace(".", "/")
        init = base + "/__init__.py"
        return init if init in self.src and base + ".py" not in self.src else base + ".py"

    def _bind(self, body: list, path: str, package: str, out: dict, lazy: bool, typing: bool = False) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(package)):
                mod = self.module_path(node.module or "", node.level, path)
                for a in node.names:
                    sub = self.module_path(f"{mod[:-3].removesuffix('/__init__')}/{a.name}".replace("/", "."), 0, "")
                    out[a.asname or a.name] = (sub, "") if sub in self.src else (mod, a.name)
            elif isinstance(node, ast.If):
                v = _platform_test(node.test, self.platform, typing)
                for branch in ([node.body, node.orelse] if v is None else [node.body if v else node.orelse]):
                    self._bind(branch, path, package, out, lazy, typing)
            elif isinstance(node, ast.Try):
                self._bind(node.body, path, package, out, lazy, typing)
            elif (not lazy and isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and isinstance(node.value, (ast.Name, ast.Attribute))):
                out[node.targets[0].id] = (path, ast.unparse(node.value))  # `Alias = Other` / `= module.Other`

    def lookup(self, module: str, name: str, depth: int = 0) -> ClassInfo | None:
        self.load(module)
        if (module, name) in self.classes:
            return self.classes[(module, name)]
        if depth > 12:
            return None
        if "." in name:  # `module.Class`, the module bound by an import
            head, _, rest = name.partition(".")
            mod, orig = self.bindings.get(module, {}).get(head, (None, None))
            return self.lookup(mod, rest, depth + 1) if mod and not orig else None
        mod, orig = self.bindings.get(module, {}).get(name, (None, None))
        if mod is None or (mod, orig) == (module, name):
            return None
        return self.lookup(mod, orig or name, depth + 1) if orig != "" else None

    def base_classes(self, ci: ClassInfo) -> list[ClassInfo | None]:
        return [self.lookup(ci.module, e) for e in (ci.base_exprs or ci.bases)]

    def resolve(self, ci: ClassInfo, method: str) -> ClassInfo | None:
        """The class whose `method` `ci` runs (Python's MRO, depth-first over known bases)."""
        if method in ci.methods:
            return ci
        for base in self.base_classes(ci):
            if base is not None and (hit := self.resolve(base, method)):
                return hit
        return None

    def ancestors(self, ci: ClassInfo, depth: int = 0) -> list[ClassInfo]:
        """`ci` and every base the wheel defines, depth-first."""
        out = [ci]
        for base in self.base_classes(ci) if depth < 16 else []:
            if base is not None:
                out += [a for a in self.ancestors(base, depth + 1) if a not in out]
        return out

    def attr_classes(self, ci: ClassInfo, depth: int = 0) -> dict[str, str]:
        """`self.<attr> = SomeClass(...)` assignments in the __init__s of `ci` and its bases."""
        out = {}
        for base in reversed(self.base_classes(ci)):
            if base is not None and depth < 8:
                out.update(self.attr_classes(base, depth + 1))
        init = ci.methods.get("__init__")
        for node in ast.walk(init) if init else []:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out[t.attr] = node.value.func.id
        return out

    def function(self, ci: ClassInfo, method: str, env: dict | None = None):
        return compile_function(self.src[ci.module], ci.module, ci.methods[method], env)


# --- stub objects the methods run on ----------------------------------------------


class Holder:
    """An inner model: records what the method sets on it (no methods of its own)."""


class Delegate:
    """A wrapped model whose own method the outer one calls."""

    def __init__(self):
        self.calls: list = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(layer_ids)


def stub_model(num_layers: int, **attrs) -> SimpleNamespace:
    cfg = SimpleNamespace(num_hidden_layers=num_layers, text_config=SimpleNamespace(num_hidden_layers=num_layers))
    base = dict(pp_group=SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1), config=cfg,
                model=Holder(), language_model=Holder())
    return SimpleNamespace(**{**base, **attrs})


# --- symbolic residual stream for the capture loops --------------------------------


@dataclass(frozen=True)
class Stream:
    """The residual stream at HF boundary `index` (0 = embedding output, k = output of layer k-1).

    `part` is "h"/"r" for the (hidden, residual) halves some layers return; their sum is
    the whole stream, as the engines add them before capture.
    """

    index: int
    part: str = ""

    def __add__(self, other):
        if isinstance(other, Stream) and other.index == self.index and {self.part, other.part} == {"h", "r"}:
            return Stream(self.index)
        return NotImplemented

    def __iter__(self):
        return iter((Stream(self.index, "h"), Stream(self.index, "r")))

    def __getattr__(self, name):  # tensor methods (.to, .clone, .device ...) keep the identity
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=name, return_value=self)


class Captured(list):
    """Stands in for the engines' aux-state containers: records the streams captured, in order."""

    def __init__(self, *a, **k):
        super().__init__()

    def capture(self, hidden, *, owned=False):
        self.append(hidden)

    def finalize(self):
        return list(self)


class StubLayer:
    """Decoder layer k: calls any capture hook it is handed with the stream entering it."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, *args, **kwargs):
        for v in kwargs.values():
            if callable(v) and isinstance(getattr(v, "__self__", None), Captured):
                v(Stream(self.k))
            elif isinstance(v, Captured):
                v.append(Stream(self.k))
        return Stream(self.k + 1)

    def __getattr__(self, name):
        return mock.MagicMock(name=f"layer{self.k}.{name}")


# --- SGLang: which ids reach the capture loop ---------------------------------------

SET_LAYERS = "set_eagle3_layers_to_capture"


class Outside(Exception):
    """The method hands the ids to code that is not in the wheel (e.g. MindSpore's models)."""


# Sub-models built in a way the static scan cannot follow: (module, class) -> {attr: (module, class)}.
# Each is checked against its source line by the conformance test.
BUILT_INDIRECTLY = {
    ("sglang/srt/models/qwen3_5_text.py", "Qwen3_5ForCausalLM"): {
        "model": ("sglang/srt/models/qwen3_5.py", "Qwen3_5ForCausalLM", "body_cls = qwen3_5.Qwen3_5ForCausalLM")},
    ("sglang/srt/models/qwen3_5_text.py", "Qwen3_5MoeForCausalLM"): {
        "model": ("sglang/srt/models/qwen3_5.py", "Qwen3_5MoeForCausalLM", "body_cls = qwen3_5.Qwen3_5MoeForCausalLM")},
}


def _sub_classes(pk: Package, ci: ClassInfo) -> dict[str, ClassInfo | None]:
    out: dict[str, ClassInfo | None] = {a: pk.lookup(ci.module, n) for a, n in pk.attr_classes(ci).items()}
    for attr, (mod, name, _line) in BUILT_INDIRECTLY.get((ci.module, ci.name), {}).items():
        out[attr] = pk.classes[(mod, name)]
    return {a: c for a, c in out.items() if c is not None}  # factory functions (make_layers, ...) are not models


def _stub(pk: Package, ci: ClassInfo | None, num_layers: int) -> SimpleNamespace:
    """A stub instance of `ci`: its sub-models are stubs of their own classes, run with their own code."""
    s = stub_model(num_layers, layers=[StubLayer(k) for k in range(num_layers)], start_layer=0,
                   end_layer=num_layers, cls=ci)
    if ci is not None:
        s.model, s.language_model = _stub(pk, None, num_layers), _stub(pk, None, num_layers)
    for attr, sub in (_sub_classes(pk, ci).items() if ci else []):
        child = _stub(pk, sub, num_layers)
        owner = pk.resolve(sub, SET_LAYERS)
        if owner is not None:
            fn = pk.function(owner, SET_LAYERS)
            child.set_eagle3_layers_to_capture = (lambda f, c: lambda ids=None: f(c, ids))(fn, child)
        setattr(s, attr, child)
    return s


def _find_capture(s: SimpleNamespace, depth: int = 0):
    if "layers_to_capture" in vars(s):
        return s
    for v in vars(s).values():
        if isinstance(v, SimpleNamespace) and depth < 4 and (hit := _find_capture(v, depth + 1)):
            return hit
    return None


def sglang_layers_to_capture(pk: Package, ci: ClassInfo, ids: list[int] | None, num_layers: int):
    """(layers_to_capture as the model's forward will see it, the class that holds it)."""
    s = _stub(pk, ci, num_layers)
    owner = pk.resolve(ci, SET_LAYERS)
    try:
        pk.function(owner, SET_LAYERS)(s, None if ids is None else list(ids))
    except AttributeError as e:
        if SET_LAYERS in str(e):
            raise Outside(f"{ci.name} hands the ids to a model outside the wheel ({e})") from e
        raise
    hit = _find_capture(s)
    if hit is None:
        raise Outside(f"{ci.name}: no layers_to_capture was set")
    return list(hit.layers_to_capture), hit.cls


# --- the capture site: a model's own forward over stub layers ---------------------


class _Self(SimpleNamespace):
    """A model instance: the attributes given, anything else a MagicMock."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        v = soft(f"self.{name}")
        setattr(self, name, v)
        return v


def run_capture(pk: Package, model: ClassInfo, layers_to_capture: list[int], num_layers: int) -> list:
    """Run `model.forward` (resolved through its bases) with stub layers; return the streams captured.

    Each entry is a `Stream` (its HF boundary index) or whatever else the forward appended.
    """
    owner = pk.resolve(model, "forward")
    made: list[Captured] = []

    class Recorder(Captured):
        def __init__(self, *a, **k):
            super().__init__()
            made.append(self)

    env = {"AuxHiddenStateList": Recorder, "AuxHiddenStatePacker": Recorder}
    fn = pk.function(owner, "forward", env)
    s = _Self(layers=[StubLayer(k) for k in range(num_layers)], start_layer=0, end_layer=num_layers,
              layers_to_capture=list(layers_to_capture),
              config=_Self(num_hidden_layers=num_layers, text_config=SimpleNamespace(num_hidden_layers=num_layers)),
              pp_group=SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1),
              embed_tokens=lambda *a, **k: Stream(0), first_k_dense_replace=0)
    for layer_id in layers_to_capture:  # what set_eagle3_layers_to_capture marks on some models
        if 0 <= layer_id < num_layers:
            s.layers[layer_id]._is_layer_to_capture = True
    kwargs = {n.arg: mock.MagicMock(name=n.arg) for n in owner.methods["forward"].args.args[1:]}
    for k in ("input_embeds", "inputs_embeds", "pp_proxy_tensors", "intermediate_tensors"):
        if k in kwargs:
            kwargs[k] = None
    fn(s, **kwargs)
    return [x for r in made for x in r]
