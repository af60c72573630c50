"""DFlash layer ids: the physical points behind each convention, and what each engine can capture.

Why a module of its own: a DFlash drafter's ids come in two numberings that
look alike (docs/parallel-drafters.md §2). z-lab, SpecForge, ModelOpt and
SGLang write `dflash_config.target_layer_ids`, where id k is `layers.{k}.out`;
vLLM's top-level `eagle_aux_hidden_state_layer_ids`, speculators'
`aux_hidden_state_layer_ids` and llama.cpp's GGUF `target_layers` mean k + 1
for the same point. A list written in one numbering and read in the other
wires every slot one layer off and still loads. Every DFlash id eaglewire
reads or writes goes through here; everything else talks about points.

Engine limits (from the pinned sources, §2): vLLM 0.32 captures
`layers.0..L-1.out` for a DFlash drafter, SGLang 0.5.23 and llama.cpp 0.3.36
`layers.0..L-2.out`; `embed` (z-lab id -1) and `final_norm` nowhere; all three
concatenate in ascending depth, so an unsorted list cannot be served as trained.
"""

from __future__ import annotations

from eaglewire.infra.errors import EaglewireError, did_you_mean
from eaglewire.targets.points import Point, check_point, eagle3_default, layer_out

# convention -> (offset added to the layer index, meaning), the offset being the only difference
CONVENTIONS = {
    "zlab": (0, "z-lab/SGLang dflash_config.target_layer_ids: id k = layers.{k}.out"),
    "vllm": (1, "vLLM/speculators eagle_aux_hidden_state_layer_ids / aux_hidden_state_layer_ids: "
                "id k = layers.{k-1}.out"),
    "llama.cpp": (1, "llama.cpp GGUF target_layers: id k = layers.{k-1}.out (the input of layer k)"),
}
_ALIASES = {"sglang": "zlab", "dflash": "zlab", "z-lab": "zlab", "specforge": "zlab", "speculators": "vllm",
            "llamacpp": "llama.cpp", "gguf": "llama.cpp"}
# engine -> the deepest layer whose output it captures for a DFlash drafter (L = the target's layer count)
ENGINE_LAST = {"vllm": lambda L: L - 1, "sglang": lambda L: L - 2, "llama.cpp": lambda L: L - 2}
_ENGINE_ALIASES = {"speculators": "vllm", "specforge": "sglang", "zlab": "sglang", "gguf": "llama.cpp",
                   "llamacpp": "llama.cpp"}
# the engine whose reach bounds a convention's ids (zlab ids are read by SGLang and by vLLM, the wider)
_CONVENTION_ENGINE = {"zlab": "vllm", "vllm": "vllm", "llama.cpp": "llama.cpp"}
VLLM_KEYS = ("eagle_aux_hidden_state_layer_ids", "dflash_config.target_layer_ids",
             "eagle_config.eagle_aux_hidden_state_layer_ids")
VLLM_DEFAULT_KEY = "none read: the target's EAGLE-3 default (2, L//2, L-3)"


def convention(name: str) -> str:
    """The canonical convention name for `name` (its aliases included), or a one-line refusal."""
    n = str(name).strip().lower()
    n = _ALIASES.get(n, n)
    if n not in CONVENTIONS:
        names = [*CONVENTIONS, *_ALIASES]
        raise EaglewireError(f"DFlash id convention {name!r}: expected one of {', '.join(names)}{did_you_mean(n, names)}")
    return n


def engine(name: str) -> str:
    n = str(name).strip().lower()
    n = _ENGINE_ALIASES.get(n, n)
    if n not in ENGINE_LAST:
        raise EaglewireError(f"DFlash engine {name!r}: expected one of {', '.join(ENGINE_LAST)}")
    return n


def _why_not(p: Point, eng: str, num_layers: int) -> str | None:
    """Why `eng` cannot feed a DFlash drafter point `p` (None: it can)."""
    if p.kind == "embed":
        return f"{eng} captures no embedding for a DFlash drafter (z-lab id -1; SGLang's range check refuses it)"
    if p.kind == "final_norm":
        return f"{eng} captures no final_norm for a DFlash drafter (no engine feeds the normed output)"
    last = ENGINE_LAST[eng](num_layers)
    if p.layer > last:
        return (f"{eng} captures layers.0.out .. layers.{last}.out for a DFlash drafter on a {num_layers}-layer "
                "target (the last layer's output is not captured)")
    return None


def dflash_problems(points: list[Point], eng: str, num_layers: int) -> list[str]:
    """Why `eng` cannot serve a DFlash drafter trained on `points` as trained (empty: it can)."""
    eng = engine(eng)
    out = [f"{p.name}: {w}" for p in points if (w := _why_not(check_point(p, num_layers), eng, num_layers))]
    if list(points) != sorted(set(points)):
        out.append(f"{eng} concatenates the captured states in ascending depth without repeats, but the drafter was "
                   f"trained on {[p.name for p in points]} in that order")
    return out


def check_dflash_points(points: list[Point], eng: str, num_layers: int) -> None:
    """Raise, in one line naming the point, the engine and why, when `eng` cannot serve these points."""
    if why := dflash_problems(points, eng, num_layers):
        raise EaglewireError(f"DFlash points for {engine(eng)}: " + "; ".join(why))


def dflash_ids_for_points(points: list[Point], conv: str, num_layers: int) -> list[int | None]:
    """The ids of `conv` naming `points`; None where no engine reading that convention captures the point."""
    c = convention(conv)
    off, eng = CONVENTIONS[c][0], _CONVENTION_ENGINE[c]
    out: list[int | None] = []
    for p in points:
        ok = _why_not(check_point(p, num_layers), eng, num_layers) is None
        out.append(p.layer + off if ok else None)
    return out


def points_from_dflash_ids(ids: list[int], conv: str, num_layers: int) -> list[Point]:
    """The physical points `ids` of convention `conv` name, in the order written; raises naming the id."""
    c = convention(conv)
    off, eng = CONVENTIONS[c][0], _CONVENTION_ENGINE[c]
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise EaglewireError(f"DFlash layer id {i!r}: expected an integer ({CONVENTIONS[c][1]})")
        k = i - off
        p = layer_out(k) if k >= 0 else Point("embed")
        why = _why_not(p, eng, num_layers) if k < num_layers else f"the target has {num_layers} layers"
        if why:
            raise EaglewireError(f"DFlash {c} id {i} on a {num_layers}-layer target names {p.name if k < num_layers else f'layers.{k}.out'}: "
                                 f"{why} ({CONVENTIONS[c][1]})")
        out.append(p)
    return out


def _as_ids(v) -> list | None:
    return list(v) if v and isinstance(v, (list, tuple)) else None


def vllm_reads_dflash(cfg: dict, num_layers: int) -> tuple[list[int], str, list[Point]]:
    """What vLLM 0.32's V1 runner feeds a DFlash drafter with this config.json: (its ids, the key, the points).

    Mirrors `GPUModelRunner._get_eagle3_aux_layers_from_config` (v1/worker/gpu_model_runner.py), executed
    against it in tests/export/test_dflash_conformance.py: the top-level `eagle_aux_hidden_state_layer_ids`
    as is; else `dflash_config.target_layer_ids` + 1, then an `eagle_config` dict's own key replaces that,
    even when absent; with no ids the target's EAGLE-3 default. A speculators config reaches the runner
    through `update_dflash`, which writes both keys from `aux_hidden_state_layer_ids`.
    """
    if cfg.get("speculators_model_type") == "dflash":
        aux = cfg.get("aux_hidden_state_layer_ids")
        if not isinstance(aux, list):
            raise EaglewireError(f"speculators DFlash config: aux_hidden_state_layer_ids = {aux!r:.40}: expected a list "
                                 "of vLLM ids (vLLM's update_dflash requires it)")
        cfg = {"eagle_aux_hidden_state_layer_ids": aux,
               "dflash_config": {"target_layer_ids": [i - 1 for i in aux]}}
    ids, key = _as_ids(cfg.get("eagle_aux_hidden_state_layer_ids")), VLLM_KEYS[0]
    if ids is None:
        ids, key = None, VLLM_DEFAULT_KEY
        dflash, eagle = cfg.get("dflash_config"), cfg.get("eagle_config")
        if dflash and isinstance(dflash, dict):
            ids, key = [i + 1 for i in (dflash.get("target_layer_ids") or [])], VLLM_KEYS[1]
        if eagle and isinstance(eagle, dict):
            ids, key = eagle.get("eagle_aux_hidden_state_layer_ids"), VLLM_KEYS[2]
        ids = _as_ids(ids)
    if ids is None:
        return [2, num_layers // 2, num_layers - 3], VLLM_DEFAULT_KEY, eagle3_default(num_layers)
    try:
        return ids, key, points_from_dflash_ids(ids, "vllm", num_layers)
    except EaglewireError as e:
        raise EaglewireError(f"vLLM reads {key} = {ids}: {e}") from e
