"""Prompt files as users have them: JSONL, JSON arrays (ShareGPT), parquet (HF datasets), whole directories.

Every format yields the records :func:`~eaglewire.data.prompts.parse_record`
reads, so a conversation means the same from a JSONL line, a ShareGPT JSON
array or a parquet row, multi-turn included (the final answer is
regenerated, earlier turns are kept as context: see `prompt_turns`). Errors
name the file and the line (JSONL, malformed JSON) or the row (`file[i]`,
0-based as `ds[i]` and `jq '.[i]'` count).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path

from eaglewire.data.prompts import EXPECTED_SHAPES, Conversation, parse_record
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.hub import cached_snapshot, is_repo_id
from eaglewire.infra.paths import not_found

SUFFIXES = (".jsonl", ".json", ".parquet")
# `datasets` bookkeeping files beside the rows in a saved or cached dataset: not prompts
METADATA = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"}
PARQUET_COLUMNS = ("messages", "conversations", "prompt", "text")  # in parse_record's order of preference


def load_prompt_source(path) -> list[Conversation]:
    """Conversations from every file `path` names (see :func:`prompt_files`), in order."""
    out, files = [], prompt_files(Path(path))
    for f in files:
        out += [parse_record(obj, where) for where, obj in _records(f)]
    if not out:  # an empty file would otherwise make a finished, empty dataset
        where = files[0] if len(files) == 1 else f"--prompts {path} ({len(files)} files)"
        raise EaglewireError(f"{where}: holds no prompts (expected {EXPECTED_SHAPES})")
    return out


def prompt_files(p: Path) -> list[Path]:
    """A file; a directory's prompt files (recursively, sorted); a glob; or a dataset in the local HF cache
    (`org/name`, optionally followed by a path or glob inside its snapshot, e.g.
    `HuggingFaceH4/ultrachat_200k/data/train_sft-*.parquet`)."""
    if p.is_file():
        return [p]
    if p.is_dir():
        return _dir_files(p)
    if glob.has_magic(str(p)):
        hits = sorted(Path(x) for x in glob.glob(str(p), recursive=True))
        files = [f for h in hits for f in ([h] if h.is_file() else _dir_files(h))]
        if files:
            return files
    parts = p.parts
    # a local directory wins over a hub id of the same spelling (as for targets): a typo under runs/x is a typo
    if len(parts) >= 2 and is_repo_id("/".join(parts[:2])) and not Path(parts[0]).exists():
        repo = "/".join(parts[:2])
        snap = cached_snapshot(repo, "dataset", f"--prompts {p}")
        return prompt_files(snap.joinpath(*parts[2:])) if len(parts) > 2 else _dir_files(snap)
    raise not_found(p, "prompt file")


def local_inputs(p: Path) -> list[Path]:
    """The local files or directories a --prompts value reads (a glob's hits); [] for a dataset in the HF cache."""
    if glob.has_magic(str(p)):
        return [Path(x) for x in glob.glob(str(p), recursive=True)]
    return [Path(p)] if Path(p).exists() else []


def _dir_files(d: Path) -> list[Path]:
    files = sorted((f for f in d.rglob("*") if f.suffix in SUFFIXES and f.name not in METADATA and f.is_file()
                    and not any(s.startswith(".") for s in f.relative_to(d).parts)),
                   key=lambda f: f.relative_to(d).as_posix())
    if not files:
        raise EaglewireError(f"{d}: no {', '.join(SUFFIXES)} files (expected prompt files or a dataset snapshot)")
    return files


def _records(p: Path) -> Iterator[tuple[str, object]]:
    """(where, decoded record) for each record of one file, by its suffix and first character."""
    if p.suffix == ".parquet":
        yield from _parquet_rows(p)
    elif _first_char(p) == b"[":  # a JSONL line is never an array: this is one JSON document
        yield from _json_array(p)
    elif (one := _one_json_object(p)) is not None:
        yield str(p), one
    else:
        yield from _jsonl(p)


def _one_json_object(p: Path, max_bytes: int = 64 << 20):
    """A `.json` file holding a single (possibly pretty-printed) record, else None (read as JSONL)."""
    if p.suffix != ".json" or _first_char(p) != b"{" or p.stat().st_size > max_bytes:
        return None
    try:
        obj = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # JSONL (several lines) or broken: the line reader names the line
    except RecursionError:
        raise _too_deep(str(p)) from None
    return obj if isinstance(obj, dict) else None


def _first_char(p: Path) -> bytes:
    with open(p, "rb") as f:
        while chunk := f.read(65536):
            s = chunk.lstrip()
            if s:
                return s[:1]
    return b""


def _too_deep(where: str) -> EaglewireError:
    """Python's JSON decoder recurses once per nesting level; no prompt record is nested hundreds deep."""
    return EaglewireError(f"{where}: JSON nested too deep to read (hundreds of levels of [ or {{); expected {EXPECTED_SHAPES}")


def _utf8_error(p: Path, data: bytes, e: UnicodeDecodeError, kind: str) -> EaglewireError:
    line = data[: e.start].count(b"\n") + 1
    col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    return EaglewireError(f"{p}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {col}); expected a UTF-8 {kind} file")


def _jsonl(p: Path) -> Iterator[tuple[str, object]]:
    """One record per line; blank lines are skipped."""
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise EaglewireError(f"{p}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                     "expected a UTF-8 JSONL file") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EaglewireError(f"{p}:{n}: malformed JSON ({e.msg} at column {e.colno}); expected {EXPECTED_SHAPES}") from e
            except RecursionError:
                raise _too_deep(f"{p}:{n}") from None
            yield f"{p}:{n}", obj


def _json_array(p: Path) -> Iterator[tuple[str, object]]:
    """A JSON array of records, as ShareGPT dumps ship (`[{"id", "conversations": [...]}, ...]`)."""
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _utf8_error(p, data, e, "JSON") from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise EaglewireError(f"{p}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno}); expected a JSON array "
                             f"of records ({EXPECTED_SHAPES})") from e
    except RecursionError:
        raise _too_deep(str(p)) from None
    for i, obj in enumerate(rows):
        yield f"{p}[{i}]", obj


def _parquet_rows(p: Path) -> Iterator[tuple[str, object]]:
    """Rows as HF datasets store them (UltraChat: `prompt`, `messages` [{role, content}]); null cells count as absent."""
    try:
        import pyarrow as pa  # optional: only parquet prompt files need it
        import pyarrow.parquet as pq  # optional: as above
    except ImportError:
        raise EaglewireError(f"{p}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(p)
        names = pf.schema_arrow.names
        cols = [c for c in PARQUET_COLUMNS if c in names]
        if not cols:
            raise EaglewireError(f"{p}: no {', '.join(PARQUET_COLUMNS)} column (columns: {', '.join(names)}); "
                                 "expected one holding the prompts")
        i = 0
        for batch in pf.iter_batches(batch_size=4096, columns=cols):
            for row in batch.to_pylist():
                yield f"{p}[{i}]", {k: v for k, v in row.items() if v is not None}
                i += 1
    except (pa.ArrowException, OSError) as e:
        raise EaglewireError(f"{p}: not a readable parquet file ({type(e).__name__}: {e})") from e


def load_prompts(path) -> list[Conversation]:
    """Conversations from a JSONL, JSON (ShareGPT array) or parquet file, a directory or glob of them, or a
    dataset in the local HF cache; the format is detected per file (and per JSONL line).

    The readers below yield records for :func:`eaglewire.data.prompts.parse_record`.
    """
    return load_prompt_source(path)
