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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import EaglewireError

# Engine keys accepted by `points_from_ids` / `ids_for_points`.
ENGINES = ("hf", "sglang", "sglang-new", "specforge", "vllm", "speculators", "eagle")
ENGINE_HELP = {
    "hf": "transformers output_hidden_states index (0 = embed, k = output of layer k-1, L = final norm)",
    "eagle": "official EAGLE-3 repository: HF index meaning, hard-coded [2, L//2, L-3]",
    "sglang": "SGLang: id i = output of layer i (captures at input of layer i+1); no embed, no last layer",
    "sglang-new": "newer SGLang: like sglang, except that a list whose first id is 1 is read without the +1 (HF meaning)",
    "specforge": "SpecForge: same meaning as sglang (id i = output of layer i)",
    "vllm": "vLLM: id i = input of layer i (0 = embed, L = last layer's pre-norm output)",
    "speculators": "speculators: vLLM meaning",
}
_ALIASES = {"eagle": "hf", "specforge": "sglang", "speculators": "vllm"}
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


def eagle3_default(num_layers: int) -> list[Point]:
    """The official EAGLE-3 triple: HF indices [2, L//2, L-3] as physical points."""
    L = num_layers
    if L < 5:
        raise EaglewireError(f"the EAGLE-3 default capture needs at least 5 layers (target has {L})")
    return [points_from_ids([2, L // 2, L - 3], "hf", L)[i] for i in range(3)]


# --- single-id conversions (engine meaning, no list-level rules) -------------


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
    return None  # SGLang cannot capture the embedding, the last layer's output, or the final norm


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


_TO = {"hf": _to_hf, "vllm": _to_vllm, "sglang": _to_sglang}
_FROM = {"hf": _from_hf, "vllm": _from_vllm, "sglang": _from_sglang}


def _engine(engine: str) -> str:
    if engine not in ENGINES:
        raise EaglewireError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    return _ALIASES.get(engine, engine)


def _sglang_new_reads_as_hf(ids: list[int]) -> bool:
    return bool(ids) and ids[0] == 1


# --- list conversions ----------------------------------------------------------


def points_from_ids(ids: list[int], engine: str, num_layers: int) -> list[Point]:
    """Physical points that `engine` captures for `ids`; raises if it cannot."""
    eng = _engine(engine)
    if eng == "sglang-new":
        eng = "hf" if _sglang_new_reads_as_hf(ids) else "sglang"
    out = []
    for i in ids:
        p = _FROM[eng](int(i), num_layers)
        if p is None:
            raise EaglewireError(
                f"{engine} id {i} with {num_layers} layers: out of range or not capturable "
                f"({ENGINE_HELP[engine]})"
            )
        out.append(p)
    return out


def ids_for_points(points: list[Point], engine: str, num_layers: int) -> list[int | None]:
    """The ids that make `engine` capture `points`; None where it cannot."""
    eng = _engine(engine)
    for p in points:
        check_point(p, num_layers)
    if eng != "sglang-new":
        return [_TO[eng](p, num_layers) for p in points]
    classic = [_TO["sglang"](p, num_layers) for p in points]
    if classic and classic[0] == 1:
        # Newer SGLang would read this list without the +1: one layer early.
        # A list starting at id 1 under that reading means layers.0.out first,
        # so a first point of layers.1.out has no id list in that version.
        return [None] * len(points)
    return classic


def id_lists(points: list[Point], num_layers: int) -> dict[str, list[int | None]]:
    """Every engine's ids for `points`, for manifests, provenance and `inspect`."""
    out: dict[str, list[int | None]] = {"names": [p.name for p in points]}  # type: ignore[dict-item]
    out["hf_index"] = ids_for_points(points, "hf", num_layers)
    for eng in ("sglang", "sglang-new", "specforge", "vllm", "speculators"):
        out[eng.replace("-", "_")] = ids_for_points(points, eng, num_layers)
    return out


def sglang_version_warning(ids: list[int], num_layers: int) -> str | None:
    """Say so when classic and newer SGLang read the same ids differently."""
    if not _sglang_new_reads_as_hf(ids):
        return None
    try:
        a = [p.name for p in points_from_ids(ids, "sglang", num_layers)]
    except EaglewireError:
        a = None
    try:
        b = [p.name for p in points_from_ids(ids, "sglang-new", num_layers)]
    except EaglewireError:
        b = None
    if a == b:
        return None
    return (
        f"SGLang ids {ids} start with 1: classic SGLang captures {a}, newer SGLang "
        f"(no +1 when the first id is 1) captures {b}; pin the SGLang version you serve with"
    )

