"""Issue 36's mutation generator for `probe_hardening.py`: every file eaglewire reads back from an artifact it
(or another tool) wrote, damaged in the ways files get damaged, read by the command that reads it.

Each artifact is built once in the `World` (tiny target, tiny dataset, a trained tiny drafter, exports, a
killed training run, a serve record, a GGUF drafter); each case copies it, mutates one file, and runs the
command that reads that file. Expected: the right result, or exit 2 with one `error:` line naming the file.

Mutations of a JSON file: each listed key removed (`drop-K`), given a wrong type (`type-K`: a string where a
number is, a list where an object is, ...), null (`null-K`, the first keys), a value nested 10 000 levels
deep (`nest`), huge numbers (`huge-K-1e308`, `-1e30` for 10**30, `-neg` for -1), the file cut in half
(`trunc`), non-UTF-8 bytes in a string (`not-utf8`), an empty file (`empty`), and for keys holding a path,
`../../outside` (`path-K-dotdot`) and an absolute path outside the artifact (`path-K-abs`). Of a JSONL file:
a truncated last line, a line that is no object, a non-UTF-8 line, an empty file, a nested line, huge and
negative indices. Of a GGUF file: truncated, garbage, header only, a header claiming 2**62 tensors, empty.

"Right" for a command that exits 0 (or 1 with a doctor's verdict): its output is the one the intact file
gives (the mutation touches nothing it reads), or a line the intact file does not print names the file or the
mutated key (a warning, a FAIL row). Any other output is `silently-wrong`, with the first line that differs.

Names are `mut-<file>-<mutation>` (`--only mut-`, or `--only mut-manifest` for one file); `mut-<file>-intact`
runs the intact file first and its output is what the others are compared with. The list is fixed here
(keys named per file), so the set of cases does not depend on the artifacts built.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from _probe_cases import Case, Wrong
from _probe_world import Res, World, cli, write

ITEM = 0  # not one of the numbered items: its closing paragraph (the generator)
MEM_GIB = 6  # a huge size in a file must fail as an error, not take the machine
TIMEOUT = 90
NEST = 10_000
NULLS = 2  # `null-K` for the first keys of each file
VICTIM = "the user's file"
_NEST_MARK = "\u0000nest\u0000"

# ---------------------------------------------------------------------------------------------- artifacts


def _cache(w: World) -> dict:
    return w.__dict__.setdefault("_mutations", {})


def _once(w: World, key: str, build: Callable[[], Path]) -> Path:
    c = _cache(w)
    if key not in c:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            c[key] = build()
    return c[key]


def _killed(w: World) -> Path:
    """A training run killed after its last state was saved (drafter/ not yet written), as `killed_run`."""
    def build() -> Path:
        (w.tmp / "mut-killed").mkdir()
        return w.killed_run(w.tmp / "mut-killed")
    return _once(w, "killed", build)


def _drafter_vllm(w: World) -> Path:
    """The trained tiny drafter exported for vLLM (what a serve record names)."""
    def build() -> Path:
        from eaglewire.export.config import ExportConfig
        from eaglewire.export.exporter import run_export

        return Path(run_export(ExportConfig(ckpt=w.drafter, format="vllm", out=w.tmp / "mut-drafter-vllm"))["out"])
    return _once(w, "drafter-vllm", build)


def _gguf(w: World) -> Path:
    """`export --format gguf --gguf-type f32` of a drafter trained on a tiny llama with SmolLM2's tokenizer
    (llama.cpp's converter refuses tiny:llama's BPE), as tests/engines/test_llama_server.py makes it."""
    def build() -> Path:
        from eaglewire.export.config import ExportConfig
        from eaglewire.export.exporter import run_export
        from eaglewire.training.config import TrainConfig
        from eaglewire.training.loop import run_train
        from eaglewire_testing.llamacpp import build_smollm_tiny
        from eaglewire_testing.tinydata import build_tiny_dataset

        root = w.tmp / "mut-gguf"
        root.mkdir()
        target = build_smollm_tiny(root / "target")
        ds = build_tiny_dataset(root, n=4, max_new_tokens=4, target=str(target))
        run_train(TrainConfig(data=ds, out=root / "run", device="cpu", max_steps=1, warmup_steps=1, batch_size=1,
                              save_every=1000))
        out = run_export(ExportConfig(ckpt=root / "run" / "drafter", format="gguf", out=root / "gguf", gguf_type="f32"))
        return Path(out["out"])
    return _once(w, "gguf", build)


def _target_dir() -> Path:
    from eaglewire.targets.load import load_target

    return Path(load_target("tiny:llama").path)


def _gen_dir(w: World, d: Path) -> Path:
    """A `data generate` output killed after 6 of 8 answers (prompts.jsonl, generate.config.json kept)."""
    g = d / "gen"
    g.mkdir()
    for f in ("prompts.jsonl", "generate.config.json"):
        shutil.copy2(w.llama_ds / f, g / f)
    lines = (w.llama_ds / "responses.jsonl").read_text().splitlines(keepends=True)
    write(g / "responses.jsonl", "".join(lines[:6]))
    return g


# ---------------------------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class Art:
    """One file eaglewire reads back, inside an artifact a case copies, and the command that reads it."""

    slug: str  # <file> in the case names
    rel: str  # the file, relative to the case directory once `make` ran
    make: Callable[[World, Path], list]  # copies the artifact under d; returns the arguments of the reading command
    kind: str = "json"  # json | jsonl | gguf
    keys: tuple[str, ...] = ()  # dotted key paths (a number indexes a list) for drop-/type-, the first NULLS for null-
    numeric: tuple[str, ...] = ()  # dotted key paths of numbers for huge-*
    paths: tuple[str, ...] = ()  # dotted key paths holding a path for path-*
    muts: tuple[str, ...] | None = None  # jsonl/gguf: which of the mutations (default: all)
    also: tuple[str, ...] = ()  # other words an error line may hold instead of the file's name
    doctor: bool = False  # exit 1 with a JSON report is a verdict (its rows compared), not a failure
    protect: tuple[str, ...] = ()  # paths under d the command must leave as they are
    timeout: float = TIMEOUT

    @property
    def name(self) -> str:
        return Path(self.rel).name


def _train(w: World, d: Path) -> list:
    return ["train", "--data", w.copy(w.llama_ds, d / "ds"), "--out", d / "run", "--max-steps", 1, "--device", "cpu",
            "--json"]


def _train_config(w: World, d: Path) -> list:
    raw = json.loads((w.drafter.parent / "train.config.json").read_text())
    raw["config"].update(data=str(w.llama_ds), out=str(d / "run"), max_steps=1, json=True)
    return ["train", "--config", write(d / "train.config.json", json.dumps(raw, indent=2))]


def _resume(w: World, d: Path) -> list:
    run = w.copy(_killed(w), d / "run")
    return ["train", "--data", w.llama_ds, "--out", run, "--device", "cpu", "--max-steps", 2, "--save-every", 1,
            "--resume", "--json"]


def _export_ckpt(w: World, d: Path) -> list:
    return ["export", w.copy(w.drafter, d / "ck"), "--format", "vllm", "--out", d / "out", "--json"]


def _inspect(w: World, d: Path) -> list:
    return ["inspect", "--target", w.copy(_target_dir(), d / "t"), "--device", "cpu", "--json"]


def _extract(w: World, d: Path) -> list:
    return ["data", "extract", w.copy(w.llama_answers, d / "data"), "--device", "cpu", "--json"]


def _regenerate(w: World, d: Path) -> list:
    return ["data", "generate", "--resume", "--out", _gen_dir(w, d), "--device", "cpu", "--json"]


def _serve_record(w: World, d: Path) -> list:
    """The record `eaglewire serve` leaves beside the run (serve/serve.json naming the export its server
    loaded), read by `doctor live` to name the fix when the served acceptance is off (it is, here)."""
    from eaglewire_testing.fake_vllm import counters, models

    drafter = w.copy(w.drafter, d / "run" / "drafter")
    export = w.copy(_drafter_vllm(w), d / "run" / "serve" / "vllm")
    rec = {"url": "http://127.0.0.1:8000", "command": f"vllm serve {_target_dir()} --speculative-config ...",
           "export": str(export), "ids": [2, 4, 5], "engine": "vllm 0.32.0", "target": "tiny:llama",
           "log": str(d / "run" / "serve" / "vllm.log")}
    write(d / "run" / "serve" / "serve.json", json.dumps(rec, indent=2))
    srv = w.vllm(served=models("tiny:llama"), metrics=[counters(0, [0, 0, 0]), counters(100, [100, 100, 100])])
    return ["doctor", "live", "--server", srv.url, "--drafter", drafter, "--num-prompts", 2, "--max-new-tokens", 4,
            "--json"]


_D = "eaglewire_drafter_config"

ARTS = (
    Art("manifest", "ds/manifest.json", _train, keys=("format", "format_version", "complete", "target", "points",
                                                      "extract", "shards", "num_samples"),
        numeric=("num_samples", "shards.0.num_tokens"), paths=("shards.0.file", "target.path"), protect=("ds",)),
    Art("vocab", "ds/vocab.json", _train, keys=("size", "vocab_size", "coverage", "num_counted_tokens", "num_distinct"),
        numeric=("size",), protect=("ds",)),
    Art("generate-config", "data/generate.config.json", _extract,
        keys=("command", "config", "config.target", "config.max_new_tokens", "config.temperature", "result"),
        numeric=("config.max_new_tokens",), paths=("config.prompts", "config.out"),
        protect=("data/responses.jsonl",)),
    Art("train-config", "train.config.json", _train_config,
        keys=("config", "command", "config.data", "config.out", "config.points", "config.batch_size", "config.lr"),
        numeric=("config.lr",), paths=("config.data", "config.out"), also=("--config",), protect=("train.config.json",)),
    Art("resume-config", "run/train.config.json", _resume, keys=("config", "config.data", "config.max_steps",
                                                                 "config.batch_size"),
        paths=("config.data",), also=("changed config",)),
    Art("state-meta", "run/state/meta.json", _resume, keys=("step", "skipped"), numeric=("step",)),
    Art("ckpt-config", "ck/config.json", _export_ckpt,
        keys=(_D, f"{_D}.hidden_size", f"{_D}.num_attention_heads", f"{_D}.vocab_size", f"{_D}.draft_vocab_size",
              f"{_D}.num_aux", f"{_D}.rope_theta", "architectures"),
        numeric=(f"{_D}.intermediate_size",), protect=("ck",)),
    Art("ckpt-provenance", "ck/eaglewire.json", _export_ckpt,
        keys=("format", "version", "points", "points.names", "target_num_layers", "target", "target.fingerprint",
              "dataset"),
        numeric=("target_num_layers",), paths=("dataset.path", "training.config.data"), protect=("ck",)),
    Art("export-config", "src/config.json",
        lambda w, d: ["import", w.copy(w.export("sglang"), d / "src"), "--out", d / "imp", "--target-layers", 8, "--json"],
        keys=("architectures", "hidden_size", "num_attention_heads", "vocab_size", "draft_vocab_size", "eagle_config",
              "eagle_config.eagle_aux_hidden_state_layer_ids", "rope_parameters"),
        numeric=("intermediate_size",), protect=("src",)),
    Art("export-record", "src/eaglewire.export.json",
        lambda w, d: ["doctor", "config", w.copy(w.export("vllm"), d / "src"), "--json"],
        keys=("source", "format", "points", "target_num_layers", "ids", "engine_spec", "target_fingerprint", _D),
        numeric=("target_num_layers",), paths=("source",), doctor=True, protect=("src",)),
    Art("target-config", "t/config.json", _inspect,
        keys=("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
              "rope_parameters", "head_dim"),
        numeric=("num_hidden_layers",), protect=("t",)),
    Art("tokenizer-config", "t/tokenizer_config.json", _inspect,
        keys=("backend", "bos_token", "eos_token", "model_max_length", "pad_token", "tokenizer_class"),
        numeric=("model_max_length",), protect=("t",)),
    Art("serve-record", "run/serve/serve.json", _serve_record, keys=("export", "url", "engine", "target"),
        paths=("export",), doctor=True, protect=("run",)),
    Art("responses", "data/responses.jsonl", _extract, kind="jsonl"),
    Art("responses-resume", "gen/responses.jsonl", _regenerate, kind="jsonl",
        muts=("trunc-last", "not-object", "not-utf8", "nest", "index-neg")),
    Art("prompts", "gen/prompts.jsonl", _regenerate, kind="jsonl", protect=("gen/prompts.jsonl",)),
    Art("gguf", "gguf/drafter.gguf", lambda w, d: ["doctor", "config", w.copy(_gguf(w), d / "gguf"), "--engine",
                                                   "llama.cpp", "--json"], kind="gguf", doctor=True),
)

# ---------------------------------------------------------------------------------------------- mutations

Mutate = Callable[[bytes, Path], bytes]  # (the file's bytes, the case directory) -> the mutated bytes


def _steps(key: str) -> list:
    return [int(k) if k.isdigit() else k for k in key.split(".")]


def _parent(obj, key: str, where: str):
    *up, last = _steps(key)
    for k in up:
        obj = obj[k]
    try:
        obj[last]
    except (KeyError, IndexError, TypeError):
        raise KeyError(f"{where} has no {key!r}: the artifact changed, update _probe_mutations.py") from None
    return obj, last


def _edit(key: str, how: Callable) -> Mutate:
    """`how(container, k, d)` changes the parsed JSON at `key`; written back as JSON."""
    def mutate(raw: bytes, d: Path) -> bytes:
        obj = json.loads(raw)
        parent, last = _parent(obj, key, "the file")
        how(parent, last, d)
        text = json.dumps(obj, indent=2)
        return text.replace(json.dumps(_NEST_MARK), "[" * NEST + "]" * NEST).encode()
    return mutate


def wrong_type(v):
    """A value of another JSON type than `v`: a string for a number, a list for an object, ..."""
    if isinstance(v, bool):
        return "yes"
    if isinstance(v, (int, float)):
        return "abc"
    if isinstance(v, str):
        return 12345
    if isinstance(v, dict):
        return [1, 2]
    if isinstance(v, list):
        return {"a": 1}
    return [1, 2]  # null where an object (or anything) may be


def _set(value) -> Callable:
    def how(parent, k, d):
        parent[k] = value(parent[k], d) if callable(value) else value
    return how


def _drop(parent, k, d):
    del parent[k]


def _outside(original, d: Path) -> str:
    """An absolute path outside the artifact, to something that exists: a victim file named like the original
    (when that names a file) or a victim directory."""
    out = d / "outside"
    name = Path(str(original)).name
    if Path(name).suffix:
        write(out / name, VICTIM)
        return str(out / name)
    write(out / "victim.txt", VICTIM)
    return str(out)


def _not_utf8(raw: bytes) -> bytes:
    """Bytes that are no UTF-8 inside the first string value (else the first string)."""
    m = re.search(rb'":\s*"', raw)
    at = m.end() if m else raw.index(b'"') + 1
    return raw[:at] + b"caf\xe9\xff" + raw[at:]


class Mut(NamedTuple):
    name: str
    mutate: Mutate
    key: str = ""  # the dotted key it changes, if one
    protect: tuple[str, ...] = ()  # more paths under d that must come out unchanged


def json_mutations(art: Art) -> list[Mut]:
    """Every mutation of one JSON file, in a fixed order."""
    out = [Mut(f"drop-{k}", _edit(k, _drop), k) for k in art.keys]
    out += [Mut(f"type-{k}", _edit(k, _set(lambda v, d: wrong_type(v))), k) for k in art.keys]
    out += [Mut(f"null-{k}", _edit(k, _set(None)), k) for k in art.keys[:NULLS]]
    out.append(Mut("nest", _edit(art.keys[0], _set(_NEST_MARK)), art.keys[0]))
    for k in art.numeric:
        out += [Mut(f"huge-{k}-1e308", _edit(k, _set(1e308)), k), Mut(f"huge-{k}-1e30", _edit(k, _set(10 ** 30)), k),
                Mut(f"huge-{k}-neg", _edit(k, _set(-1)), k)]
    for k in art.paths:
        out += [Mut(f"path-{k}-dotdot", _edit(k, _set("../../outside")), k),
                Mut(f"path-{k}-abs", _edit(k, _set(_outside)), k, ("outside",))]
    out += [Mut("trunc", lambda raw, d: raw[: len(raw) // 2]),
            Mut("not-utf8", lambda raw, d: _not_utf8(raw)),
            Mut("empty", lambda raw, d: b"")]
    return out


def _line2(edit: Callable[[bytes], bytes]) -> Mutate:
    def mutate(raw: bytes, d: Path) -> bytes:
        lines = raw.splitlines(keepends=True)
        lines[1] = edit(lines[1])
        return b"".join(lines)
    return mutate


def _row2(change: Callable[[dict], None]) -> Mutate:
    def edit(line: bytes) -> bytes:
        row = json.loads(line)
        change(row)
        return json.dumps(row).replace(json.dumps(_NEST_MARK), "[" * NEST + "]" * NEST).encode() + b"\n"
    return _line2(edit)


def _nest_first(row: dict) -> None:
    row[next(k for k in row if k != "index")] = _NEST_MARK


def _trunc_last(raw: bytes, d: Path) -> bytes:
    """The last line cut in half, no newline after it (a writer killed mid-line)."""
    body = raw.rstrip(b"\n")
    last = body.rsplit(b"\n", 1)[-1]
    return body[: len(body) - len(last) // 2]


JSONL = {
    "trunc-last": _trunc_last,
    "not-object": _line2(lambda ln: b"[1, 2]\n" + ln),
    "not-utf8": _line2(_not_utf8),
    "empty": lambda raw, d: b"",
    "nest": _row2(_nest_first),
    "index-huge": _row2(lambda r: r.update(index=10 ** 30)),
    "index-float": _row2(lambda r: r.update(index=1e308)),
    "index-neg": _row2(lambda r: r.update(index=-1)),
}


def _gguf_header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


GGUF = {
    "trunc": lambda raw, d: raw[: len(raw) // 2],
    "garbage": lambda raw, d: random.Random(0).randbytes(65536),
    "header-only": lambda raw, d: raw[:24],
    "header-2e62-tensors": lambda raw, d: _gguf_header(1 << 62, 1 << 62) + raw[24:4096],
    "empty": lambda raw, d: b"",
}


def mutations(art: Art) -> list[Mut]:
    if art.kind == "json":
        return json_mutations(art)
    table = JSONL if art.kind == "jsonl" else GGUF
    return [Mut(n, table[n], "index" if n.startswith("index-") else "") for n in (art.muts or table)]

# ---------------------------------------------------------------------------------------------- outcomes


_VOLATILE = re.compile(r'("[A-Za-z_]*(?:per_s|seconds|_s|elapsed)"\s*:\s*)-?[0-9.eE+]+')


def _norm(text: str, d: Path) -> str:
    for p in sorted({str(d), str(d.resolve())}, key=len, reverse=True):
        text = text.replace(p, "{d}")
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    return _VOLATILE.sub(r"\g<1>0", text)


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]


@dataclass
class Outcome:
    rc: int | None
    stdout: str
    lines: set


def _outcome(res: Res, d: Path) -> Outcome:
    return Outcome(res.rc, _norm(res.stdout, d), set(_lines(_norm(res.stdout + "\n" + res.stderr, d))))


def baseline(w: World, art: Art) -> Outcome:
    """What the command prints for the intact file (run once, unless `mut-<file>-intact` ran first)."""
    c = _cache(w).setdefault("baseline", {})
    if art.slug not in c:
        d = w.tmp / "mut-baseline" / art.slug
        d.mkdir(parents=True)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = art.make(w, d)
        c[art.slug] = _outcome(cli(args, d, art.timeout, mem_gib=MEM_GIB), d)
    return c[art.slug]


def _ok_rc(art: Art, res: Res) -> None:
    ok = (0, 1) if art.doctor else (0,)
    if res.rc not in ok:
        last = (_lines(res.stderr) or _lines(res.stdout) or [""])[-1]
        raise Wrong(f"exit {res.rc}: {last[:160]}")
    if art.doctor:
        try:
            json.loads(res.stdout)
        except ValueError:
            raise Wrong(f"exit {res.rc} without a JSON report: {res.stdout.strip()[-120:]!r}") from None


def _intact(art: Art):
    def check(res: Res, w: World, d: Path) -> str:
        _ok_rc(art, res)
        _cache(w).setdefault("baseline", {})[art.slug] = _outcome(res, d)
        return f"exit {res.rc}: the output the mutated files are compared with"
    return check


def _same_or_says(art: Art, key: str = "", also: tuple[str, ...] = ()):
    """Exit 0 (or a doctor's 1): right when the output is the intact file's, or a line the intact file does not
    print names the file or the mutated key (`key`'s last part, when it is an identifier such as draft_vocab_size
    rather than a word such as `target`), or `also` (a path leading outside: the output names where it went)."""
    last = key.rsplit(".", 1)[-1]
    names = (art.name, *([last] if "_" in last else []), *also)

    def check(res: Res, w: World, d: Path) -> str:
        _ok_rc(art, res)
        base, got = baseline(w, art), _outcome(res, d)
        if got.rc == base.rc and got.stdout == base.stdout:
            return f"exit {res.rc}, the output of the intact file (the mutation touches nothing it reads)"
        says = [ln for ln in _lines(_norm(res.stdout + "\n" + res.stderr, d))
                if ln not in base.lines and any(x in ln for x in names)]
        if says:
            return f"exit {res.rc}, says: {says[0][:140]}"
        old, new = _lines(base.stdout), _lines(got.stdout)
        i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        was = old[i] if i < len(old) else "(end)"
        now = new[i] if i < len(new) else "(end)"
        raise Wrong(f"exit {res.rc} (intact: exit {base.rc}), nothing names {' or '.join(names)}, and the output differs "
                    f"from the intact file's at line {i + 1}: {was[:70]!r} -> {now[:70]!r}")
    return check


def _prep(art: Art, mutate: Mutate | None):
    def prep(w: World, d: Path) -> list:
        args = art.make(w, d)
        if mutate is not None:
            f = d / art.rel
            f.write_bytes(mutate(f.read_bytes(), d))
        return args
    return prep


def mutation_cases() -> list[Case]:
    cases = []
    for art in ARTS:
        cases.append(Case(f"mut-{art.slug}-intact", ITEM, _prep(art, None), check=_intact(art), protect=art.protect,
                          timeout=art.timeout, mem_gib=MEM_GIB))
        for m in mutations(art):
            # a path leading outside may be named by its own value instead of the file it was read from
            said = (art.name, *art.also, *(("outside",) if m.name.startswith("path-") else ()))
            cases.append(Case(f"mut-{art.slug}-{m.name}", ITEM, _prep(art, m.mutate), words=(said,),
                              check=_same_or_says(art, m.key, said[len(art.also) + 1:]), protect=(*art.protect, *m.protect), timeout=art.timeout,
                              mem_gib=MEM_GIB))
    return cases
