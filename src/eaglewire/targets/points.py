"""Capture points: the one physical truth, and every engine's ids for it.

Engines number layers differently (see docs/conventions.md §1):
the same integer 30 means "output of layer 30" in SGLang and "input of
layer 30" (= output of layer 29) in vLLM. Every id that eaglewire reads or
writes passes through this module, and everything else in the package
talks about points only by their physical names:

    embed            embedding output (input of layer 0)
    layers.{k}.out   residual stream after decoder layer k, before any norm
    final_norm       output of the final norm (what the lm_head sees)

An engine that cannot capture a point gets `None` (JSON null), never a guess.

What an id means depends on the engine, its version and, for SGLang 0.5.13
and later, the target's architecture (docs/conventions.md §2). The rules
here are the ones the pinned engines' own code was executed against in
tests/export/test_engine_conformance.py; the engine registry (registry.py) pins those versions,
and says which rule each engine applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eaglewire.infra.errors import EaglewireError, did_you_mean
from eaglewire.targets.registry import (  # noqa: F401 (the engine facts, importable from here as before)
    DEFAULT_ENGINE,
    ENGINE_HELP,
    ENGINES,
    ORDERED_ENGINES,
    PINNED,
    SGLANG_END_CAPTURE_SINCE,
    SGLANG_FIRST_ID_ARCHS,
    SGLANG_FIRST_ID_RULE_SINCE,
    SGLANG_LAST_ALWAYS_PLUS_ONE,
    SGLANG_LAST_ID_ARCHS,
    SGLANG_LAST_ID_RULE_SINCE,
    SGLANG_SHIFTED_DEFAULT_ARCHS,
    engine_spec,
    first_id_family,
    id_rule_version,
    pinned_version,
)
from eaglewire.targets.vllm_pp import Stages, captures, fed, ids_for

_LAYER_RE = re.compile(r"^layers\.(\d+)\.out$")


@dataclass(frozen=True)
class Point:
    """A physical target tensor. Ordered by depth: embed < layers.k.out < final_norm."""

    kind: str  # "embed" | "layer" | "final_norm"
    layer: int = -1

    @property
    def name(self) -> str:
        if self.kind == "layer":
            return f"layers.{self.layer}.out"
        return self.kind

    @property
    def depth(self) -> float:
        return {"embed": -1.0, "layer": float(self.layer), "final_norm": float("inf")}[self.kind]

    def __lt__(self, other: Point) -> bool:
        return self.depth < other.depth

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def parse(name: str) -> Point:
        if name == "embed":
            return Point("embed")
        if name == "final_norm":
            return Point("final_norm")
        m = _LAYER_RE.match(name)
        if not m:
            raise EaglewireError(
                f"capture point {name!r}: expected 'embed', 'layers.<k>.out' or 'final_norm'"
            )
        return Point("layer", int(m.group(1)))


EMBED = Point("embed")
FINAL_NORM = Point("final_norm")


def layer_out(k: int) -> Point:
    return Point("layer", k)


def check_point(p: Point, num_layers: int) -> Point:
    if p.kind == "layer" and not 0 <= p.layer < num_layers:
        raise EaglewireError(
            f"capture point {p.name}: the target has {num_layers} layers (expected layers.0.out .. layers.{num_layers - 1}.out)"
        )
    return p


def parse_points(names: list[str] | tuple[str, ...], num_layers: int) -> list[Point]:
    return [check_point(Point.parse(n), num_layers) for n in names]


_FROM_END_RE = re.compile(r"^layers\.-(\d+)\.out$")


def point_option(values: list[str] | tuple[str, ...], num_layers: int, default: bool = True) -> list[Point]:
    """`--points` as given (repeated and/or comma-separated) -> Points; empty means the EAGLE-3 default
    (or no points, with ``default=False``).

    A user names points for a target of any depth, so the option also takes a named set
    (POINT_SETS, resolved against this target) and layers counted from the end (`layers.-2.out`
    is the second-to-last layer's output); what is recorded is always the physical name.
    """
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    out: list[Point] = []
    for n in names:
        if n in POINT_SETS:
            out += POINT_SETS[n][0](num_layers)
            continue
        m = _FROM_END_RE.match(n)
        if m:
            k = int(m.group(1))
            if not 1 <= k <= num_layers:
                raise EaglewireError(f"capture point {n}: the target has {num_layers} layers "
                                     f"(expected layers.-1.out .. layers.-{num_layers}.out)")
            n = f"layers.{num_layers - k}.out"
        elif n not in ("embed", "final_norm") and not _LAYER_RE.match(n):
            raise EaglewireError(f"capture point {n!r}: expected 'embed', 'layers.<k>.out' (or layers.-<k>.out from "
                                 f"the end), 'final_norm' or a set: {', '.join(POINT_SETS)}{did_you_mean(n, POINT_SETS)}")
        out += parse_points([n], num_layers)
    if out:
        return out
    return eagle3_default(num_layers) if default else []


def eagle3_default(num_layers: int) -> list[Point]:
    """The official EAGLE-3 triple: HF indices [2, L//2, L-3] as physical points."""
    return _hf_triple(num_layers, 3)


def eagle3_deep(num_layers: int) -> list[Point]:
    """EAGLE-3's triple with the last slot moved to the last layer's input (HF [2, L//2, L-1]).

    It is the deepest point every engine serves (SGLang and HF cannot name the last layer's own
    output), and the warm start then copies the target's last layer. On the default target it
    gained +0.022 held-out acceptance (paired 95%: +0.004 to +0.040) over the official triple.
    """
    return _hf_triple(num_layers, 1)


def _hf_triple(num_layers: int, back: int) -> list[Point]:
    L = num_layers
    if L < 5:
        raise EaglewireError(f"the EAGLE-3 capture triple needs at least 5 layers (target has {L})")
    return points_from_ids([2, L // 2, L - back], "hf", L)[:3]


# named --points sets: name -> (points for a target of L layers, help)
POINT_SETS = {
    "eagle3": (eagle3_default, "the default, HF ids [2, L//2, L-3]"),
    "eagle3-deep": (eagle3_deep, "HF [2, L//2, L-1]"),
}
# the --points help of every command that captures, generated from the sets
POINTS_HELP = ("embed, layers.<k>.out (layers.-2.out counts from the end), final_norm, or a set: "
               + ", ".join(f"{n} ({h})" for n, (_, h) in POINT_SETS.items()))


# --- engines, versions and the rule each applies -------------------------------


def _version_tuple(v: str) -> tuple[int, ...]:
    m = re.match(r"^(\d+(?:\.\d+)*)", v)
    if not m:
        raise EaglewireError(f"engine version {v!r}: expected a release number such as {pinned_version('sglang')}")
    return tuple(int(x) for x in m.group(1).split("."))


@dataclass(frozen=True)
class Engine:
    """An engine as it reads ids: name, version (None = not given) and target architecture.

    `arch` is the target's HF architecture (e.g. DeepseekV3ForCausalLM) or model_type;
    it matters only for SGLang >= 0.5.13, where two model files read ids differently.
    """

    name: str
    version: str | None = None
    arch: str | None = None

    @staticmethod
    def parse(spec: str | Engine, arch: str | None = None) -> Engine:
        if isinstance(spec, Engine):
            return spec if arch is None or spec.arch else Engine(spec.name, spec.version, arch)
        name, _, version = str(spec).strip().partition("==")
        name = name.strip().lower()
        if name not in ENGINES:
            pin = pinned_version("sglang")
            hint = f" (newer SGLang is now named by version: sglang=={pin})" if name == "sglang-new" else ""
            raise EaglewireError(f"engine {spec!r}: expected one of {', '.join(ENGINES)}, "
                                 f"optionally with ==VERSION (e.g. sglang=={pin}){hint or did_you_mean(name, ENGINES)}")
        if version:
            _version_tuple(version)
        return Engine(name, version.strip() or None, arch)

    @property
    def assumed_version(self) -> str | None:
        """The version whose rule applies: the one given, else the newest verified."""
        return self.version or id_rule_version(self.name)

    @property
    def rule(self) -> str:
        """'hf', 'vllm', 'sglang' (always +1), 'sglang-first-id' (+1 only when the first id is 1) or
        'sglang-last-id' (no +1 when the largest id is L)."""
        spec = engine_spec(self.name)
        if spec is None or not spec.ids_by_family:
            return spec.rule if spec else self.name
        v = _version_tuple(self.assumed_version)
        if v >= _version_tuple(SGLANG_FIRST_ID_RULE_SINCE) and first_id_family(self.arch):
            return "sglang-first-id"
        if v >= _version_tuple(SGLANG_LAST_ID_RULE_SINCE) and self.arch in SGLANG_LAST_ID_ARCHS:
            return "sglang-last-id-end" if v >= _version_tuple(SGLANG_END_CAPTURE_SINCE) else "sglang-last-id"
        return "sglang"

    def label(self) -> str:
        out = self.name + (f" {self.assumed_version}" if id_rule_version(self.name) else "")
        return out + (f" ({self.arch})" if self.arch and self.name == "sglang" else "")

    def assumptions(self) -> list[str]:
        """What was assumed because it was not given, or is not verified (empty: nothing)."""
        out = []
        pin = id_rule_version(self.name)
        if pin and not self.version:
            out.append(f"no {self.name} version given: assumed {pin}, the newest whose code the tests execute")
        elif pin and _version_tuple(self.version) > _version_tuple(pin):
            out.append(f"{self.name} {self.version} is newer than {pin}, the newest verified: its rule is assumed unchanged")
        if self.name == "sglang" and not self.arch and _version_tuple(self.assumed_version) >= _version_tuple(
                SGLANG_FIRST_ID_RULE_SINCE):
            out.append("target architecture unknown: assumed the +1 rule of 27 of SGLang's 29 model files "
                       "(DeepSeek-V2/V3, Kimi-K2.5, GLM-4-MoE-Lite read ids differently); pass --target")
        return out

    def versions(self) -> list[Engine]:
        """This engine under each rule-distinct version known (for 'check every version')."""
        if self.name != "sglang" or self.version:
            return [self]
        return [Engine("sglang", SGLANG_LAST_ALWAYS_PLUS_ONE, self.arch),
                Engine("sglang", pinned_version("sglang"), self.arch)]


def default_points(engine: str | Engine, num_layers: int, arch: str | None = None) -> list[Point]:
    """What `engine` captures when the draft config names no ids."""
    eng = as_engine(engine, arch)
    if eng.name == "sglang" and eng.arch in SGLANG_SHIFTED_DEFAULT_ARCHS:
        return points_from_ids([2, num_layers // 2, num_layers - 3], eng, num_layers)
    return eagle3_default(num_layers)


def as_engine(engine: str | Engine, arch: str | None = None) -> Engine:
    return Engine.parse(engine, arch)


# --- single-id conversions (one rule, no list-level conditions) ---------------


def _to_hf(p: Point, L: int) -> int | None:
    if p.kind == "embed":
        return 0
    if p.kind == "final_norm":
        return L
    return p.layer + 1 if p.layer < L - 1 else None  # last layer's pre-norm output has no HF index


def _to_vllm(p: Point, L: int) -> int | None:
    if p.kind == "embed":
        return 0
    if p.kind == "final_norm":
        return None
    return p.layer + 1


def _to_sglang(p: Point, L: int) -> int | None:
    if p.kind == "layer" and p.layer <= L - 2:
        return p.layer
    return None  # the embedding, the last layer's output and the final norm: refused (see conventions)


def _to_sglang_raw(p: Point, L: int) -> int | None:
    """SGLang without the +1: id i hooks the stream entering layer i, for 1 <= i <= L-1."""
    return p.layer + 1 if p.kind == "layer" and p.layer <= L - 2 else None


def _to_llamacpp(p: Point, L: int) -> int | None:
    """llama.cpp marks `t_layer_inp[il] = inpL` at the top of layer il (src/models/llama.cpp); an id equal
    to L asks for the target's pre-norm `t_h_nextn`, which the llama graph never sets: refused."""
    if p.kind == "embed":
        return 0
    return p.layer + 1 if p.kind == "layer" and p.layer <= L - 2 else None


def _from_llamacpp(i: int, L: int) -> Point | None:
    if i == 0:
        return EMBED
    return layer_out(i - 1) if 1 <= i <= L - 1 else None


def _from_hf(i: int, L: int) -> Point | None:
    if i == 0:
        return EMBED
    if 1 <= i <= L - 1:
        return layer_out(i - 1)
    return FINAL_NORM if i == L else None


def _from_vllm(i: int, L: int) -> Point | None:
    if i == 0:
        return EMBED
    return layer_out(i - 1) if 1 <= i <= L else None


def _from_sglang(i: int, L: int) -> Point | None:
    return layer_out(i) if 0 <= i <= L - 2 else None


def _from_sglang_raw(i: int, L: int) -> Point | None:
    return layer_out(i - 1) if 1 <= i <= L - 1 else None


def _from_sglang_raw_last(i: int, L: int) -> Point | None:
    """gpt_oss.py's list with L in it: kept as written, L captured after the last layer (end_layer)."""
    return layer_out(i - 1) if 1 <= i <= L else None


def _to_sglang_raw_last(p: Point, L: int) -> int | None:
    return p.layer + 1 if p.kind == "layer" else None


def _from_sglang_end(i: int, L: int) -> Point | None:
    """The +1 with a capture at the end of the stack: id L-1 is the last layer's output."""
    return layer_out(i) if 0 <= i <= L - 1 else None


def _to_sglang_end(p: Point, L: int) -> int | None:
    return p.layer if p.kind == "layer" else None


_TO = {"hf": _to_hf, "vllm": _to_vllm, "sglang": _to_sglang, "sglang-raw": _to_sglang_raw, "llamacpp": _to_llamacpp,
       "sglang-raw-last": _to_sglang_raw_last, "sglang-end": _to_sglang_end}
_FROM = {"hf": _from_hf, "vllm": _from_vllm, "sglang": _from_sglang, "sglang-raw": _from_sglang_raw,
         "llamacpp": _from_llamacpp, "sglang-raw-last": _from_sglang_raw_last, "sglang-end": _from_sglang_end}


def _list_rule(rule: str, ids: list[int], num_layers: int) -> str:
    """The single-id rule a whole list is read with (SGLang's first-id and last-id conditions)."""
    if rule == "sglang-first-id":
        return "sglang" if ids and ids[0] == 1 else "sglang-raw"
    kept = bool(ids) and max(ids) == num_layers
    if rule == "sglang-last-id":  # kept as written, but nothing captured at L yet
        return "sglang-raw" if kept else "sglang"
    if rule == "sglang-last-id-end":
        return "sglang-raw-last" if kept else "sglang-end"
    return rule


# --- list conversions ----------------------------------------------------------


def _int_id(i) -> int:
    if isinstance(i, bool) or not isinstance(i, int):
        raise EaglewireError(f"layer id {i!r}: expected an integer")
    return i


def points_from_ids(ids: list[int], engine: str | Engine, num_layers: int, arch: str | None = None) -> list[Point]:
    """Physical points that `engine` captures for each of `ids` (in the order given); raises if it cannot."""
    eng = as_engine(engine, arch)
    out = id_meanings(ids, eng, num_layers)
    for i, p in zip(ids, out):
        if p is None:
            raise EaglewireError(f"{eng.label()} id {i} with {num_layers} layers: out of range or not capturable "
                                 f"({ENGINE_HELP[eng.name]})")
    return out  # type: ignore[return-value]


def id_meanings(ids: list[int], engine: str | Engine, num_layers: int, arch: str | None = None,
                pp: Stages | None = None) -> list[Point | None]:
    """Per id, the point `engine` captures for it within this list (None: nothing), never raising.
    vLLM reads some ids per serving class (vllm_pp.py): over `pp` stages, or in its Transformers backend."""
    eng = as_engine(engine, arch)
    ids = [_int_id(i) for i in ids]
    if eng.rule == "vllm" and (per_id := captures(ids, eng.arch, num_layers, pp)) is not None:
        return [_from_vllm(c[0], num_layers) if c else None for c in per_id]
    rule = _list_rule(eng.rule, ids, num_layers)
    return [_FROM[rule](i, num_layers) for i in ids]


def fed_points(ids: list[int], engine: str | Engine, num_layers: int, arch: str | None = None,
               pp: Stages | None = None) -> list[Point | None]:
    """What `engine` feeds the drafter for `ids`, slot by slot, None where an id captures nothing.

    Both SGLang and vLLM walk the layers in order and capture at matching ids, so the
    slots arrive in ascending depth with duplicates merged, whatever order the ids
    were written in (vLLM even sorts them: `tuple(sorted(set(layers)))`).
    """
    eng = as_engine(engine, arch)
    if eng.rule == "vllm" and (slots := fed([_int_id(i) for i in ids], eng.arch, num_layers, pp)) is not None:
        return [_from_vllm(v, num_layers) for v in slots[0]] + [None] * slots[1]  # per class (vllm_pp.py)
    got = id_meanings(ids, eng, num_layers)
    if eng.rule in ORDERED_ENGINES:
        return got
    return sorted(set(p for p in got if p is not None)) + [None] * sum(p is None for p in got)


def ids_for_points(points: list[Point], engine: str | Engine, num_layers: int, arch: str | None = None,
                   pp: Stages | None = None) -> list[int | None]:
    """The ids that make `engine` capture `points`; None where it cannot (vLLM: per class, over `pp` stages)."""
    eng = as_engine(engine, arch)
    for p in points:
        check_point(p, num_layers)
    if eng.rule == "vllm" and (got := ids_for([_to_vllm(p, num_layers) for p in points], eng.arch, num_layers, pp)):
        return got
    if eng.rule == "sglang-last-id":  # the +1 ids; the last layer's output cannot be captured
        return [_TO["sglang"](p, num_layers) for p in points]
    if eng.rule == "sglang-last-id-end":  # the +1 ids, id L-1 captured at the end of the stack
        return [_TO["sglang-end"](p, num_layers) for p in points]
    if eng.rule != "sglang-first-id":
        return [_TO[eng.rule](p, num_layers) for p in points]
    classic = [_TO["sglang"](p, num_layers) for p in points]
    if classic and classic[0] == 1:
        return classic  # a first id of 1 switches the +1 on: the classic meaning holds
    raw = [_TO["sglang-raw"](p, num_layers) for p in points]
    if raw and raw[0] == 1:
        return [None] * len(points)  # layers.0.out first: its raw id 1 would switch the +1 on
    return raw


def order_problem(points: list[Point], engine: str | Engine) -> str | None:
    """Why no id list can feed `points` in this order (engines deliver ascending, unique slots)."""
    eng = as_engine(engine)
    if eng.rule in ORDERED_ENGINES or list(points) == sorted(set(points)):
        return None
    return (f"{eng.name} feeds the slots in ascending layer order without repeats, but the drafter was trained on "
            f"{[p.name for p in points]}")


def id_lists(points: list[Point], num_layers: int) -> dict[str, list[int | None]]:
    """Every engine's ids for `points`, for manifests, provenance and `inspect`."""
    out: dict[str, list[int | None]] = {"names": [p.name for p in points]}  # type: ignore[dict-item]
    out["hf_index"] = ids_for_points(points, "hf", num_layers)
    out["sglang"] = ids_for_points(points, "sglang", num_layers)
    out["sglang_deepseek"] = ids_for_points(points, Engine("sglang", pinned_version("sglang"), "DeepseekV3ForCausalLM"),
                                            num_layers)
    for eng in (e for e in ENGINES if engine_spec(e).rule != "hf" and e != "sglang"):  # the rest, one rule each
        out[eng] = ids_for_points(points, eng, num_layers)
    return out


ID_LIST_HELP = {
    "sglang": "SGLang, every version, and >= 0.5.13 on all but the targets below",
    "sglang_deepseek": f"SGLang >= {SGLANG_FIRST_ID_RULE_SINCE} on DeepSeek-V2/V3/V3.2, Kimi-K2.5, GLM-4-MoE-Lite, GLM-5 "
                       "(+1 only when the first id is 1)",
}


def version_differences(ids: list[int], engine: str | Engine, num_layers: int, arch: str | None = None
                        ) -> str | None:
    """Say so when the known versions (or target families) of `engine` read the same ids differently."""
    eng = as_engine(engine, arch)
    if eng.name != "sglang":
        return None
    versions = [eng] if eng.version else eng.versions()
    archs = [eng.arch] if eng.arch else [None, "DeepseekV3ForCausalLM"]
    groups: dict[str, dict[str, list[str]]] = {}  # what the ids capture -> version -> target families
    for v in versions:
        for a in archs:
            e = Engine("sglang", v.version, a)
            try:
                got = ", ".join(p.name for p in points_from_ids(ids, e, num_layers))
            except EaglewireError:
                got = "nothing it can capture"
            ver = (f"< {SGLANG_FIRST_ID_RULE_SINCE}" if _version_tuple(e.assumed_version) < _version_tuple(
                SGLANG_FIRST_ID_RULE_SINCE) and not eng.version else e.assumed_version)
            fam = "DeepSeek-family targets" if a and not eng.arch else a or "other targets"
            groups.setdefault(got, {}).setdefault(ver, []).append(fam)
    if len(groups) < 2:
        return None

    def readers(by_version: dict[str, list[str]]) -> str:  # "SGLang < 0.5.13 (any target) and SGLang 0.5.23 on ..."
        return " and ".join(f"SGLang {v}" + (" (any target)" if len(fams) == len(archs) > 1 else f" on {fams[0]}")
                            for v, fams in by_version.items())

    parts = [f"{what} to {readers(by_version)}" for what, by_version in groups.items()]  # one clause per meaning
    fix = f"name the engine version (e.g. sglang=={pinned_version('sglang')})" + ("" if eng.arch else " and the target's class (--arch)")
    return f"SGLang ids {ids} are read differently: " + "; ".join(parts) + f"; {fix}"
