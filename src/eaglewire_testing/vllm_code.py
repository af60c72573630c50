"""vLLM's own model code, from its pinned wheel: which targets support EAGLE-3, and what each captures.

Why: vLLM keeps one capture loop per model file (40-odd of them), each with its
own numbering; the runner refuses, at startup, any target class that lacks the
`SupportsEagle3` interface. Both facts are read here from the wheel's source,
statically (importing vLLM's model modules needs CUDA, torchvision and more), and
the loops are executed on stub layers (engine_code.py says how).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from types import SimpleNamespace

from eaglewire_testing.engine_code import (
    ClassInfo,
    Package,
    Permissive,
    Stream,
    compile_function,
    soft,
    sources,
    wheel,
)

MODEL_DIRS = ("vllm/model_executor/models/", "vllm/models/")
REGISTRY = "vllm/model_executor/models/registry.py"
INTERFACES = "vllm/model_executor/models/interfaces.py"
# The registry tables of generation targets (pooling models and drafters never capture for EAGLE-3).
GENERATION_TABLES = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS")
# The line the runner stops with when the target class lacks the interface (v1/worker/gpu_model_runner.py).
REFUSAL_SOURCE = "vllm/v1/worker/gpu_model_runner.py"
REFUSAL = "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"


def vllm_package(version: str, platform: str = "cuda") -> Package:
    """The model modules of the vLLM wheel, parsed on demand, with imports resolved for `platform`."""
    whl = wheel("vllm", version)
    src: dict[str, str] = {}
    for d in (*MODEL_DIRS, REFUSAL_SOURCE):
        src.update(sources(whl, d))
    return Package.parse(src, "vllm", platform=platform, lazy=True)


def registry(pk: Package) -> dict[str, tuple[str, str]]:
    """Registered generation architecture -> (module path, class name), as `_VLLM_MODELS` merges them."""
    tables: dict[str, dict] = {}
    order: list[str] = []
    for node in ast.parse(pk.src[REGISTRY]).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "_VLLM_MODELS":
                order = [ast.unparse(v) for v in node.value.values]  # `**_TEXT_GENERATION_MODELS`, ...
            elif name.endswith("_MODELS") and isinstance(node.value, ast.Dict):
                try:
                    tables[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass  # computed tables (pooling ones): not targets here
    merged: dict[str, tuple[str, str]] = {}
    for t in order:
        merged.update(tables.get(t, {}))
    wanted = {a for t in GENERATION_TABLES for a in tables[t]}
    out = {}
    for arch, (mod, cls) in merged.items():
        if arch in wanted:
            dotted = mod if mod.startswith("vllm.") else f"vllm.model_executor.models.{mod}"
            out[arch] = (pk.module_path(dotted, 0, ""), cls)
    return out


def supports_eagle3(pk: Package, ci: ClassInfo) -> bool:
    return any(a.name == "SupportsEagle3" and a.module == INTERFACES for a in pk.ancestors(ci))


def eagle3_archs(pk: Package) -> dict[str, ClassInfo | None]:
    """Every registered generation architecture -> its class (None: the source does not define it)."""
    return {arch: pk.lookup(mod, cls) for arch, (mod, cls) in registry(pk).items()}


def refusal_line(pk: Package) -> str:
    """The runner's refusal, joined from its two string literals, as it appears in the source."""
    text = pk.src[REFUSAL_SOURCE]
    i = text.index('"Model does not support EAGLE3 interface but "')
    return "".join(ast.literal_eval(s.strip()) for s in text[i:text.index(")", i)].splitlines() if s.strip())


# --- executing the capture loops ----------------------------------------------------------

# Files whose decoder layers return the whole stream first, with the source line that says so.
FULL_STREAM_LAYERS = {
    "vllm/model_executor/models/cohere2_moe.py": "hidden_states = residual + hidden_states_attention + hidden_states_mlp",
    "vllm/model_executor/models/muse_glimmer.py": "hidden_states = residual + hidden_states\n        return hidden_states, residual",
    "vllm/model_executor/models/gemma4.py": "hidden_states = hidden_states * self.layer_scalar\n\n        return hidden_states, None",
}

H = 8  # tokens in the stub batch: positions.shape[0]


@dataclass(frozen=True)
class VStream(Stream):
    """A Stream with a batch shape, so vLLM's all-gather guards (`x.shape[0] != positions.shape[0]`) pass."""

    @property
    def shape(self):
        return (H, 64)

    def __add__(self, other):
        if isinstance(other, Stream) and other.index == self.index and {self.part, other.part} == {"h", "r"}:
            return VStream(self.index)
        return NotImplemented

    def __iter__(self):
        return iter((VStream(self.index, "h"), VStream(self.index, "r")))

    def __getitem__(self, key):
        return self

    def __mul__(self, other):  # a constant scale (muP multipliers, sqrt(H) embedding scale) keeps the identity
        return self

    __rmul__ = __truediv__ = __mul__


class VLayer:
    """Decoder layer k of vLLM: returns the stream after it, split in (hidden, residual) when unpacked.

    `whole`: the file's layers return the whole stream first (residual already added; FULL_STREAM_LAYERS
    quotes the line), and the stub hands no residual with it: a loop that adds one fails loudly."""

    def __init__(self, k: int, whole: bool = False):
        self.k, self.whole = k, whole

    def __call__(self, *args, **kwargs):
        return (VStream(self.k + 1), None) if self.whole else VStream(self.k + 1)

    def __getattr__(self, name):  # flags (`use_attn_reduce_scatter_for_moe`) are off
        return off(f"layer{self.k}.{name}")


class Intermediate(dict):
    """vLLM's IntermediateTensors: what one pipeline stage hands the next."""

    def __init__(self, tensors=None, *a, **k):
        super().__init__(tensors or {})

    @property
    def tensors(self):
        return self


def class_constants(pk: Package, ci: ClassInfo) -> dict:
    """Literal class attributes of `ci` and its bases (`supports_aux_hidden_states_over_pp = True`, ...)."""
    out: dict = {}
    for c in reversed(pk.ancestors(ci)):
        for node in c.node.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and value is not None:
                try:
                    out[target.id] = ast.literal_eval(value)
                except ValueError:
                    continue
    return out


class Loose(SimpleNamespace):
    """A config: the attributes given, anything else a soft MagicMock."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return soft(f"config.{name}")


def _method(pk: Package, owner: ClassInfo, name: str, obj, env: dict):
    """`owner.name` compiled from source and bound to `obj`; a bare `super()` in it resolves past `owner`."""
    class Super:
        def __getattr__(self, attr):
            for base in pk.base_classes(owner):
                hit = base and pk.resolve(base, attr)
                if hit:
                    return _method(pk, hit, attr, obj, env)
            raise AttributeError(attr)

    node = owner.methods[name]
    fn = compile_function(pk.src[owner.module], owner.module, node, {**env, "super": lambda *a: Super()}, Scope)
    if any(ast.unparse(d).endswith("property") for d in node.decorator_list):
        return fn(obj)
    return lambda *a, **k: fn(obj, *a, **k)


class Scope(Permissive):
    """Module globals of a vLLM model file: unknown functions return what unpacks like (hidden, residual)."""

    make = staticmethod(lambda key: off(key))


class Instance(SimpleNamespace):
    """A stub instance of a model class: given attributes, its class's constants and its own methods."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        pk, ci, env = self.__dict__["_pk"], self.__dict__["_ci"], self.__dict__["_env"]
        owner = pk.resolve(ci, name)
        if owner is not None:
            bound = _method(pk, owner, name, self, env)
            setattr(self, name, bound)
            return bound
        consts = class_constants(pk, ci)
        if name in consts:
            return consts[name]
        if self.__dict__.get("_strict"):
            raise AttributeError(name)
        v = off(f"self.{name}")
        setattr(self, name, v)
        return v


def off(name: str):
    """A model attribute the stub does not know: a flag that is off (`if self.use_sequence_parallel:`),
    or a submodule (`self.norm_f(h, r)`) whose output unpacks like a (hidden, residual) pair."""
    m = soft(name)
    m.__bool__.return_value = False
    out = soft(f"{name}()")
    m.side_effect = lambda *a, **k: a[0] if a and isinstance(a[0], Stream) else out  # dropout, scaling: identity
    return m


def _env(pp: SimpleNamespace) -> dict:
    def fake_import(name, *a, **k):
        if name.startswith("vllm"):
            return SimpleNamespace(model_parallel_is_initialized=lambda: pp.world_size > 1,
                                   get_pp_group=lambda: pp, IntermediateTensors=Intermediate)
        if name.startswith("transformers"):  # the Transformers backend records layer outputs by name
            return SimpleNamespace(OutputRecorder=lambda cls, layer_name: layer_name,
                                   maybe_install_capturing_hooks=lambda model: None)
        return __import__(name, *a, **k)

    return {"get_pp_group": lambda: pp, "IntermediateTensors": Intermediate,
            "__builtins__": {**vars(builtins), "__import__": fake_import}}


def run_stage(pk: Package, site: ClassInfo, ids: tuple[int, ...], n: int, start: int, end: int,
              pp: SimpleNamespace, carried):
    """One pipeline stage of `site.forward` over stub layers `start..end-1` of `n`."""
    env = _env(pp)
    whole = site.module in FULL_STREAM_LAYERS
    s = Instance(_pk=pk, _ci=site, _env=env, layers=[VLayer(k, whole) for k in range(n)], start_layer=start,
                 end_layer=end, config=Loose(num_hidden_layers=n, hidden_size=64),
                 embed_input_ids=lambda *a, **k: VStream(0), embed_tokens=lambda *a, **k: VStream(0),
                 norm=lambda h, r=None, *a, **k: (h, r), aux_hidden_state_layers=())
    if pk.resolve(site, "_set_aux_hidden_state_layers") is not None:
        s._set_aux_hidden_state_layers(tuple(ids))
    else:  # set from outside by its ForCausalLM (deepseek_v2.py: `self.model.aux_hidden_state_layers = layers`)
        s.aux_hidden_state_layers = tuple(ids)
    return s.forward(input_ids=soft("input_ids"), positions=SimpleNamespace(shape=(H,), ndim=1),
               intermediate_tensors=carried, inputs_embeds=None)


def vllm_capture(pk: Package, site: ClassInfo, ids: tuple[int, ...], n: int, split: int | None = None) -> list:
    """What the drafter is fed: the last stage's aux list (one stage, or two split at `split`)."""
    bounds = [(0, n)] if split is None else [(0, split), (split, n)]
    carried = None
    out = None
    for rank, (a, b) in enumerate(bounds):
        pp = SimpleNamespace(is_first_rank=rank == 0, is_last_rank=rank == len(bounds) - 1,
                             world_size=len(bounds), rank=rank)
        out = run_stage(pk, site, ids, n, a, b, pp, carried)
        carried = out
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list):
        return out[1]
    return []


def capture_sites(pk: Package, targets: list[ClassInfo]) -> list[ClassInfo]:
    """Classes whose own forward runs a capture loop, in the files of the EAGLE-3 targets and their bases."""
    modules = {a.module for ci in targets for a in pk.ancestors(ci)}
    out = []
    for c in list(pk.classes.values()):
        fwd = c.methods.get("forward")
        text = ast.unparse(fwd) if c.module in modules and fwd else ""
        if "aux_hidden_state_layers" in text or "_maybe_add_hidden_state" in text:
            out.append(c)
    return sorted(out, key=lambda c: (c.module, c.name))


def default_ids(pk: Package, ci: ClassInfo, n: int) -> tuple[int, ...]:
    """`get_eagle3_default_aux_hidden_state_layers()` of a target class whose decoder has `n` layers."""
    interfaces = pk.classes[(INTERFACES, "SupportsEagle3")]
    env = _env(SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank=0))
    decoder = SimpleNamespace(layers=[VLayer(k) for k in range(n)])
    inner = Instance(_pk=pk, _ci=interfaces, _env=env, _strict=True, model=decoder)
    s = Instance(_pk=pk, _ci=ci, _env=env, _strict=True, model=decoder, language_model=inner,
                 get_language_model=lambda: inner,
                 text_config=SimpleNamespace(num_hidden_layers=n), config=Loose(num_hidden_layers=n))
    return tuple(s.get_eagle3_default_aux_hidden_state_layers())


TRANSFORMERS_BASE = "vllm/model_executor/models/transformers/base.py"


def transformers_backend_layers(pk: Package, ids: tuple[int, ...], n: int) -> list[int]:
    """The Transformers backend's `set_aux_hidden_state_layers(ids)`: the decoder layers whose OUTPUT it
    records, in the order of its `_can_record_outputs` (what transformers returns them in). `_layer_names`
    is a dict keyed by layer index, as base.py's `_recursive_replace` fills it: id 0 raises KeyError."""
    pk.load(TRANSFORMERS_BASE)
    base = pk.classes[(TRANSFORMERS_BASE, "Base")]
    env = _env(SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank=0))
    s = Instance(_pk=pk, _ci=base, _env=env, _strict=True, model=SimpleNamespace(_can_record_outputs=None),
                 _target_class="DecoderLayer", _layer_names={k: f"model.layers.{k}" for k in range(n)},
                 _output_aux_hidden_states_kwargs={})
    s.set_aux_hidden_state_layers(tuple(ids))
    return [int(name.rsplit(".", 1)[1]) for name in s.model._can_record_outputs.values()]


def ids_reaching_decoder(pk: Package, ci: ClassInfo, ids: tuple[int, ...]) -> tuple[int, ...]:
    """The target class's own `set_aux_hidden_state_layers(ids)`: what lands on its decoder's
    `aux_hidden_state_layers` (through `language_model`, `get_language_model()` or `.model`)."""
    env = {**_env(SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank=0)),
           "EagleModelMixin": Instance}  # `assert isinstance(holder, EagleModelMixin)`: the stub decoder is one
    mixin = pk.classes[(INTERFACES, "EagleModelMixin")]
    decoder = Instance(_pk=pk, _ci=mixin, _env=env, aux_hidden_state_layers=(), start_layer=0)
    inner = Instance(_pk=pk, _ci=pk.classes[(INTERFACES, "SupportsEagle3")], _env=env, _strict=True, model=decoder)
    s = Instance(_pk=pk, _ci=ci, _env=env, _strict=True, model=decoder, language_model=inner,
                 get_language_model=lambda: inner)
    s.set_aux_hidden_state_layers(tuple(ids))
    return tuple(decoder.aux_hidden_state_layers)
