"""The dataset manifest: what every stored tensor physically is, and proof it is intact.

A dataset without provenance is how the seeds' team lost days: nobody could
say whether slot 0 held the embedding or layer 3. The manifest records the
capture points by physical name and by every engine's ids, the target's
fingerprint, the chat template hash, the generation settings and a checksum
per shard, and is rewritten atomically after every shard.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.infra.atomic import read_json, write_json_atomic
from eaglewire.infra.checksums import file_sha256
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import inside, require_exists
from eaglewire.targets.fingerprint import TargetRecord
from eaglewire.targets.points import FINAL_NORM, Point, id_lists, order_problem, parse_points

FORMAT = "eaglewire-features"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_NAME = re.compile(r"(rank-\d{5}/)?shard-\d{5}\.safetensors")  # what `write_shard` names, nothing else
_SHARD_FIELDS = {"file": str, "num_samples": int, "num_tokens": int, "num_loss_tokens": int, "indices": list,
                 "bytes": int, "sha256": str}
_ID_KEYS = ("names", "hf_index", "sglang", "sglang_deepseek", "specforge", "vllm", "speculators", "llama.cpp")


def points_to_json(points: list[Point] | None, num_layers: int | None, num_slots: int, stated_by: str | None) -> dict:
    """Every engine's ids next to the physical names, so a reader without eaglewire sees the wiring."""
    if points is None or num_layers is None:
        d = {k: [None] * num_slots for k in _ID_KEYS}
    else:
        d = id_lists(points, num_layers)
    return {**d, **({"stated_by": stated_by} if stated_by else {})}


def refuse_unservable_order(points: list[Point] | None, where: str) -> None:
    """Capture points in ascending depth without repeats, checked when a dataset is built or read for training.

    SGLang and vLLM capture the slots walking the layers, so a drafter trained on
    points in another order (or on one tensor twice) can only be refused at export,
    after hours of capture and training. Any order trains the same drafter as its
    sorted one (the fc learns the slots either way), so nothing is lost by asking.
    """
    if points is None or order_problem(points, "vllm") is None:
        return
    fix = ",".join(p.name for p in sorted(set(points), key=lambda p: p.depth))
    raise EaglewireError(f"{where}: capture points {[p.name for p in points]} are not in ascending depth without "
                         f"repeats (SGLang and vLLM deliver the slots so: a drafter trained on them could not be "
                         f"exported to either); capture --points {fix}")


def points_from_json(raw: Any, num_layers: int | None, where: str) -> tuple[list[Point] | None, int, str | None]:
    """(points or None when unknown, number of feature slots, who stated them)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("names"), list):
        raise EaglewireError(f"{where}: expected an object with a 'names' list of capture points, got {raw!r}")
    names = raw["names"]
    if all(n is None for n in names):
        return None, len(names), raw.get("stated_by")
    if num_layers is None:
        raise EaglewireError(f"{where}: points {names} are stated but the target's layer count is unknown")
    try:
        return parse_points(names, num_layers), len(names), raw.get("stated_by")
    except EaglewireError as e:
        raise EaglewireError(f"{where}: {e}") from e


@dataclass
class Manifest:
    """What every stored tensor physically is, where it came from, and the checksum of each shard.

    Rewritten atomically after every shard; keys this version does not know are
    kept as read (`extra`), so an older eaglewire never drops a newer one's facts.
    """

    target: TargetRecord
    points: list[Point] | None
    num_slots: int
    chat_template_sha: str | None = None
    generation: dict = field(default_factory=dict)
    extract: dict = field(default_factory=dict)
    target_hidden: str = FINAL_NORM.name
    forward_dtype: str | None = None  # the precision the features were computed in: the doctor's tolerance follows it
    complete: bool = False
    shards: list[dict] = field(default_factory=list)
    num_samples: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    norm_stats: list[dict] | None = None
    dropped: dict | None = None
    answer_tokens: dict | None = None  # how the answers' tokens were made: {target_ids: n, retokenized_text: n}
    vocab: dict | None = None
    extract_tokens_per_s: float | None = None
    ranks: int | None = None
    points_stated_by: str | None = None
    capture: dict | None = None  # the engine that computed the features ({"engine", "version", ...})
    pending: str | None = None  # the shard being written: the one unlisted shard file a resume may remove
    extra: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int | None:
        return self.target.fingerprint.num_layers

    @property
    def capture_engine(self) -> str:
        """Datasets written before the field existed were all captured by transformers in process."""
        return (self.capture or {}).get("engine", "transformers")

    @property
    def point_names(self) -> list[str | None]:
        return [p.name for p in self.points] if self.points is not None else [None] * self.num_slots

    def add_shard(self, entry: dict) -> None:
        self.shards.append(entry)
        self.num_samples += entry["num_samples"]
        self.num_tokens += entry["num_tokens"]
        self.num_loss_tokens += entry["num_loss_tokens"]

    def recount(self) -> None:
        self.num_samples, self.num_tokens, self.num_loss_tokens = (
            sum(e[k] for e in self.shards) for k in ("num_samples", "num_tokens", "num_loss_tokens"))

    def sample_indices(self) -> list[int]:
        return [i for s in self.shards for i in s["indices"]]

    def to_json(self) -> dict:
        d = {"format": FORMAT, "format_version": FORMAT_VERSION, "complete": self.complete,
             "target": self.target.to_json(),
             "points": points_to_json(self.points, self.num_layers, self.num_slots, self.points_stated_by)}
        for f in dataclasses.fields(self):
            if f.name not in ("target", "points", "num_slots", "complete", "points_stated_by", "extra"):
                v = getattr(self, f.name)
                if v is not None or f.name in ("chat_template_sha", "forward_dtype"):
                    d[f.name] = v
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Manifest:
        if not isinstance(raw, dict):
            raise EaglewireError(f"{where}: expected a JSON object")
        if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
            raise EaglewireError(f"{where}: format {raw.get('format')!r} v{raw.get('format_version')}, "
                                 f"expected {FORMAT} v{FORMAT_VERSION}")
        for key, typ in (("shards", list), ("target", dict), ("points", dict)):
            if not isinstance(raw.get(key), typ):
                raise EaglewireError(f"{where}: '{key}' missing or not a {typ.__name__}")
        if raw.get("answer_tokens") is not None and not isinstance(raw["answer_tokens"], dict):
            raise EaglewireError(f"{where}: 'answer_tokens' must be an object of counts, got {raw['answer_tokens']!r:.80}")
        if raw.get("capture") is not None and not isinstance(raw["capture"], dict):
            raise EaglewireError(f"{where}: 'capture' must be an object naming the engine, got {raw['capture']!r}")
        _check_fields(raw, where)
        for i, e in enumerate(raw["shards"]):
            check_shard_entry(e, f"{where}: shards[{i}]")
        if raw.get("pending") is not None and not SHARD_NAME.fullmatch(str(raw["pending"])):
            raise EaglewireError(f"{where}: 'pending' {raw['pending']!r} is not a shard name (shard-NNNNN.safetensors)")
        target = TargetRecord.from_json(raw["target"], f"{where}: target")
        pts, n, stated = points_from_json(raw["points"], target.fingerprint.num_layers, f"{where}: points")
        names = {f.name for f in dataclasses.fields(cls)}
        skip = {"format", "format_version", "target", "points"}
        known = {k: v for k, v in raw.items() if k in names and k not in skip}
        extra = {k: v for k, v in raw.items() if k not in names and k not in skip}
        return cls(target=target, points=pts, num_slots=n, points_stated_by=stated, extra=extra, **known)

    @classmethod
    def load(cls, d: Path) -> Manifest:
        """Every command that opens a dataset comes here: a mistyped path is named as such, not as "no manifest"."""
        p = require_exists(d, "dataset directory") / MANIFEST
        man = cls.from_json(read_json(p, f"not an eaglewire dataset (no {MANIFEST})"), str(p))
        for i, e in enumerate(man.shards):  # a symlink out of the dataset is refused like a '..'
            inside(Path(d), e["file"], f"{p}: shards[{i}].file")
        return man

    @staticmethod
    def exists(d: Path) -> bool:
        return (Path(d) / MANIFEST).is_file()

    def save(self, d: Path) -> None:
        write_json_atomic(Path(d) / MANIFEST, self.to_json())


_NONE = type(None)
# The types of the fields this version writes (a field that is absent takes its default, except `complete`:
# every version writes it, and reading a damaged one as "not finished" would re-extract a finished dataset).
_FIELD_TYPES = {"complete": bool, "num_samples": int, "num_tokens": int, "num_loss_tokens": int,
                "chat_template_sha": (str, _NONE), "generation": dict, "extract": dict, "target_hidden": str,
                "forward_dtype": (str, _NONE), "norm_stats": (list, _NONE), "dropped": (dict, _NONE),
                "vocab": (dict, _NONE), "extract_tokens_per_s": (int, float, _NONE), "ranks": (int, _NONE),
                "points_stated_by": (str, _NONE), "pending": (str, _NONE)}


def _check_fields(raw: dict, where: str) -> None:
    if "complete" not in raw:
        raise EaglewireError(f"{where}: 'complete' missing (every manifest says whether extraction finished)")
    for k, typ in _FIELD_TYPES.items():
        if k not in raw:
            continue
        v = raw[k]
        if (isinstance(v, bool) and typ is not bool) or not isinstance(v, typ):
            raise EaglewireError(f"{where}: '{k}' is {v!r:.60}: expected {_type_names(typ)}")
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= 2**53:
            raise EaglewireError(f"{where}: '{k}' is {v!r:.60}: expected a count from 0 to 2**53")


def _type_names(typ) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "an object",
             list: "a list", _NONE: "null"}
    return " or ".join(names[t] for t in (typ if isinstance(typ, tuple) else (typ,)))


def check_shard_entry(e: Any, where: str) -> None:
    """A shard entry holds our fields with their types, and a file name `write_shard` gives (inside the dataset)."""
    if not isinstance(e, dict):
        raise EaglewireError(f"{where}: expected an object describing a shard, got {e!r:.80}")
    for k, typ in _SHARD_FIELDS.items():
        if not isinstance(e.get(k), typ) or isinstance(e.get(k), bool):
            raise EaglewireError(f"{where}.{k}: expected {typ.__name__}, got {e.get(k)!r:.80}")
    if not SHARD_NAME.fullmatch(e["file"]):
        raise EaglewireError(f"{where}.file: {e['file']!r} is not a shard of this dataset "
                             "(expected shard-NNNNN.safetensors or rank-NNNNN/shard-NNNNN.safetensors inside it)")


def read_manifest(d: Path) -> Manifest:
    return Manifest.load(d)


def manifest_hash(d: Path) -> str:
    return file_sha256(Path(d) / MANIFEST)[:16]


def shard_problem(d: Path, entry: dict) -> str | None:
    """Why a listed shard cannot be trusted (missing, wrong size, checksum), or None when it is intact."""
    p = Path(d) / entry["file"]
    if not p.is_file():
        return "missing"
    if p.stat().st_size != entry["bytes"]:
        return f"truncated or changed ({p.stat().st_size} bytes, manifest says {entry['bytes']})"
    if file_sha256(p) != entry["sha256"]:
        return "checksum mismatch (corrupt shard)"
    return None


def verify_shards(d: Path, m: Manifest) -> None:
    """Raise naming the first shard whose bytes differ from the manifest's checksum."""
    for s in m.shards:
        why = shard_problem(d, s)
        if why:
            raise EaglewireError(f"{Path(d) / s['file']}: {why}; run `eaglewire data extract {d} --resume` "
                                 "(bad or missing shards are re-extracted)")


def complete_and_intact(d: Path) -> bool:
    """A finished dataset whose every shard still matches its checksum: nothing left to extract."""
    if not Manifest.exists(d):
        return False
    man = Manifest.load(d)
    return man.complete and not any(shard_problem(d, e) for e in man.shards)
