"""Who captured a drafter's training features, and the engine rule its ids were read with then.

A drafter config's `eagle_aux_hidden_state_layer_ids` does not carry its own meaning: the
code that captured the training features gave it one, and the serving engine may give it
another (docs/conventions.md §2). SpecForge captures through its SGLang backend (its
`OfflineSGLangCaptureBackend.set_capture_layers` hands the config's ids, unchanged, to the
target's `set_eagle3_layers_to_capture`), so a SpecForge drafter's ids mean what the SGLang
that SpecForge release installs reads: on DeepSeek-family targets (Kimi-K2.5) that changed
in SGLang 0.5.13. speculators captures through vLLM. `SPECFORGE_SGLANG` is read from the
releases on PyPI and executed in tests/targets/test_producer_conformance.py.

This module maps (producer, version) to an `Engine` of points.py and reads ids with it;
it interprets no id itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eaglewire.infra.errors import EaglewireError, did_you_mean
from eaglewire.targets.points import Engine, Point, default_points, eagle3_default, fed_points
from eaglewire.targets.registry import (
    SGLANG_FIRST_ID_RULE_SINCE,
    SGLANG_LAST_ALWAYS_PLUS_ONE,
    pinned_version,
)

# SpecForge release -> the SGLang its capture backend runs (the wheel's `Requires-Dist: sglang==`).
# None: the release captures through transformers at fixed HF indices [2, L//2, L-3] and reads no
# ids (0.1.0's `OnlineEagle3Model._prepare_data`; its sdist requires no SGLang).
SPECFORGE_SGLANG: dict[str, str | None] = {"0.1.0": None, "0.2.0": "0.5.14"}
# speculators' data generation captures through vLLM: its ids have vLLM's meaning at every release.
PRODUCERS = ("specforge", "speculators", "sglang", "vllm", "eaglewire")
PRODUCER_HELP = ("what captured the training features: specforge==V (its SGLang backend; releases "
                 f"{', '.join(SPECFORGE_SGLANG)}), speculators==V (vLLM), sglang==V or vllm==V (your own capture "
                 "through that engine, or SpecForge from a git checkout: name the SGLang it ran), eaglewire "
                 "(its record, as --trained-on)")
NESTED_KEY, TOP_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids"


def _release(v: str) -> tuple[int, ...]:
    m = re.match(r"^(\d+(?:\.\d+)*)", v)
    if not m:
        raise EaglewireError(f"version {v!r}: expected a release number such as 0.2.0")
    return tuple(int(x) for x in m.group(1).split("."))


@dataclass(frozen=True)
class Producer:
    """What captured the training features, at which version (None: not given)."""

    name: str
    version: str | None = None

    @staticmethod
    def parse(spec: str) -> Producer:
        name, _, version = str(spec).strip().partition("==")
        name, version = name.strip().lower(), version.strip() or None
        if name not in PRODUCERS:
            raise EaglewireError(f"--trained-with {spec!r}: expected one of {', '.join(PRODUCERS)}, optionally "
                                 f"==VERSION (e.g. specforge==0.2.0){did_you_mean(name, PRODUCERS)}")
        if version:
            _release(version)
        if name == "specforge" and version and version not in SPECFORGE_SGLANG:
            raise EaglewireError(f"--trained-with {spec}: a SpecForge release eaglewire has not read (known: "
                                 f"{', '.join(SPECFORGE_SGLANG)}); name the SGLang it captured through instead: "
                                 "--trained-with sglang==VERSION")
        if name == "eaglewire" and version:
            raise EaglewireError(f"--trained-with {spec}: eaglewire records its own wiring: pass --trained-on RUN")
        return Producer(name, version)

    def versions(self) -> list[Producer]:
        """This producer at each version whose reading differs (all of them when none was given)."""
        if self.version:
            return [self]
        if self.name == "specforge":
            return [Producer("specforge", v) for v in SPECFORGE_SGLANG]
        if self.name == "sglang":
            return [Producer("sglang", SGLANG_LAST_ALWAYS_PLUS_ONE), Producer("sglang", pinned_version("sglang"))]
        return [self]

    def engine(self, arch: str | None) -> Engine | None:
        """The engine whose rule read the ids at training time (None: fixed layers, no ids read)."""
        if self.name == "specforge":
            sg = SPECFORGE_SGLANG[self.version or max(SPECFORGE_SGLANG, key=_release)]
            return Engine("sglang", sg, arch) if sg else None
        if self.name == "speculators":
            return Engine("vllm", pinned_version("vllm"), arch)
        return Engine(self.name, self.version, arch)

    def label(self) -> str:
        if self.name == "specforge" and self.version:
            sg = SPECFORGE_SGLANG[self.version]
            return f"specforge {self.version} ({f'SGLang {sg}' if sg else 'fixed layers, ids not read'})"
        if self.name == "sglang" and self.version:
            before = _release(self.version) < _release(SGLANG_FIRST_ID_RULE_SINCE)
            return f"SGLang {'<' if before else '>='} {SGLANG_FIRST_ID_RULE_SINCE} capture"
        if self.name == "speculators":
            return "speculators (vLLM)"
        return self.name + (f" {self.version}" if self.version else "")


def written_ids(cfg: dict, producer: Producer) -> tuple[list[int] | None, str]:
    """The ids the drafter config holds for this producer, and the key: the one it writes, else the other."""
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    first = [(top, TOP_KEY), (nested, NESTED_KEY)] if producer.name in ("vllm", "speculators") else [
        (nested, NESTED_KEY), (top, TOP_KEY)]
    for ids, key in first:
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise EaglewireError(f"config.json {key} = {str(ids)[:60]}: expected a list of integer layer ids")
            return ids, key
    return None, first[0][1]


def trained_points(cfg: dict, producer: Producer, num_layers: int, arch: str | None) -> tuple[list[Point], str]:
    """The points `producer` captured for a drafter with this config (in slot order), and how it read them.

    Raises when the producer could not have captured them (an id past the target, the embedding on SGLang).
    """
    L = num_layers
    eng = producer.engine(arch)
    if eng is None:
        return eagle3_default(L), f"{producer.label()} captures HF [2, L//2, L-3] whatever config.json says"
    ids, key = written_ids(cfg, producer)
    if ids is None:
        if producer.name == "specforge":  # resolve_eagle_capture_layers' default, read by its SGLang
            ids = [1, L // 2 - 1, L - 4]
        else:
            return default_points(eng, L), f"{key} absent: {producer.label()} captures its default"
    fed = fed_points(ids, eng, L)
    if None in fed:
        raise EaglewireError(f"{producer.label()} cannot capture {key} = {ids} on a {L}-layer target "
                             f"({eng.label()} reads them)")
    return [p for p in fed if p is not None], f"{key} = {ids} as {eng.label()} reads them"


# Every reading offered when nothing is known of training: the producers whose rules differ.
READINGS = (Producer("specforge", "0.2.0"), Producer("specforge", "0.1.0"),
            Producer("sglang", SGLANG_LAST_ALWAYS_PLUS_ONE), Producer("sglang", pinned_version("sglang")),
            Producer("vllm", pinned_version("vllm")), Producer("speculators"))


def readings(cfg: dict, num_layers: int, arch: str | None, producers: list[Producer] | tuple[Producer, ...] = READINGS
             ) -> list[tuple[list[str] | None, list[Producer]]]:
    """(point names, or None where the producer could not capture them; the producers reading them so),
    grouped by what they read, in the order the producers are given."""
    groups: dict[tuple[str, ...] | None, list[Producer]] = {}
    for p in producers:
        written_ids(cfg, p)  # a malformed list is bad input, not a reading that captures nothing
        try:
            pts, _ = trained_points(cfg, p, num_layers, arch)
            key: tuple[str, ...] | None = tuple(q.name for q in pts)
        except EaglewireError:
            key = None
        groups.setdefault(key, []).append(p)
    return [(list(k) if k is not None else None, ps) for k, ps in groups.items()]
