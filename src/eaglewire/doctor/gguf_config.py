"""`doctor config --engine llama.cpp`: what llama-server will feed a GGUF drafter, read from the file's metadata.

llama.cpp takes the drafter's slots from `eagle3.target_layers`, which its
converter copied verbatim from whatever config.json it was given. An SGLang
export converted as is carries SGLang's ids ([1, 14, 26] for the default
target), which llama.cpp reads as layer inputs: every slot one layer early,
the seeds' bug on a fourth engine. The file says which ids it holds; this
module says what llama.cpp captures for them and whether that is what the
drafter was trained on, and names the ids to write.
"""

from __future__ import annotations

from pathlib import Path

from gguf import (
    GGUFReader,  # our pinned reader is arch-agnostic: it reads eagle3 files' keys as they are
)

from eaglewire.doctor.verdict import Report
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import Engine, Point, id_meanings, ids_for_points

# GGUF metadata -> the config.json names the trained config uses (for the numeric rows).
_NUMERIC = {"eagle3.rope.freq_base": "rope_theta", "eagle3.attention.layer_norm_rms_epsilon": "rms_norm_eps",
            "eagle3.norm_before_residual": "norm_before_residual"}


def find_gguf(d: Path) -> Path:
    """The drafter GGUF: the file itself, or the one `.gguf` an export directory holds (drafter.gguf first)."""
    d = Path(d)
    if d.is_file():
        return d
    if (d / "drafter.gguf").is_file():
        return d / "drafter.gguf"
    found = sorted(d.glob("*.gguf")) if d.is_dir() else []
    if len(found) != 1:
        raise EaglewireError(f"{d}: expected a drafter .gguf file or a directory holding one "
                             f"(found {len(found)} .gguf files)")
    return found[0]


def read_gguf_meta(path: Path) -> tuple[dict, dict]:
    """(metadata key -> value, tensor name -> shape); one line when the file is not a readable GGUF."""
    try:
        r = GGUFReader(str(path))
        meta = {}
        for k, f in r.fields.items():
            if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
                continue  # the vocabulary: large, and nothing here reads it
            meta[k] = f.contents()
        shapes = {t.name: [int(x) for x in t.shape.tolist()] for t in r.tensors}
    except Exception as e:  # noqa: BLE001  any damage in a file from elsewhere is a verdict, not a traceback
        raise EaglewireError(f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e).splitlines()[0][:100]})") from e
    return meta, shapes


def _ids(meta: dict, path: Path) -> list[int] | None:
    ids = meta.get("eagle3.target_layers")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise EaglewireError(f"{path}: eagle3.target_layers = {ids!r}: expected a list of integer layer ids")
    return ids


def doctor_config_gguf(d: Path, engine: Engine, L: int, trained: list[str] | None, trained_cfg: dict | None) -> Report:
    rep = Report("config")
    path = find_gguf(d)
    meta, shapes = read_gguf_meta(path)
    arch = meta.get("general.architecture")
    rep.add("eagle3 head", arch == "eagle3", f"{path.name}: general.architecture = {arch!r}",
            "convert the drafter with `eaglewire export CKPT --format gguf` (llama.cpp's converter makes an eagle3 "
            "GGUF only from a one-layer EAGLE-3 config)")
    ids = _ids(meta, path)
    want = [Point.parse(n) for n in trained] if trained else None
    good = ids_for_points(want, engine, L) if want else None
    fix = (f"re-export with `eaglewire export CKPT --format gguf`: it writes eagle3.target_layers = {good} "
           f"(llama.cpp reads id k as the input of layer k)" if good and None not in good else
           "llama.cpp cannot capture the trained points (it takes layer inputs 0..L-1): retrain on capturable points")
    if ids is None:
        rep.add("ids present", False, f"{path.name} has no eagle3.target_layers", fix)
        return rep
    meaning = id_meanings(ids, engine, L)
    each = ", ".join(f"{i} -> {p.name if p else 'nothing (llama.cpp aborts or reads no such layer input)'}"
                     for i, p in zip(ids, meaning))
    rep.add("ids capturable", None not in meaning and len(ids) == 3,
            f"{engine.label()} with {L} layers: {each}" + ("" if len(ids) == 3 else f"; {len(ids)} ids, llama.cpp "
                                                            "requires exactly 3"), fix)
    fed = [p.name for p in meaning if p is not None]
    rep.data.update(engine=engine.label(), engine_reads=f"eagle3.target_layers = {ids}", fed=fed, trained=trained,
                    gguf=str(path))
    if trained:
        rep.add("points", fed == list(trained), f"{engine.label()} feeds {fed} (eagle3.target_layers = {ids}, in "
                "the order written); trained on " + str(list(trained)), fix)
    else:
        rep.add("points", False, f"{engine.label()} feeds {fed}; training points unknown", "pass --trained-on CKPT",
                level="warning")
    _check_tensors(meta, shapes, rep)
    _check_numerics(meta, trained_cfg, rep)
    return rep


def _check_tensors(meta: dict, shapes: dict, rep: Report) -> None:
    need = ["fc.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_norm_2.weight",
            "blk.0.attn_q.weight", "blk.0.ffn_down.weight"]
    missing = [n for n in need if n not in shapes]
    fc = shapes.get("fc.weight")
    th = meta.get("eagle3.target_hidden_size")
    bad_fc = fc is not None and th is not None and fc[0] != 3 * th
    rep.add("tensors", not missing and not bad_fc,
            f"missing {missing}" if missing else (f"fc.weight takes {fc[0]} inputs, 3 x target_hidden_size {th} "
                                                  "expected" if bad_fc else "every draft-layer tensor present"),
            "re-export the drafter with `eaglewire export CKPT --format gguf`")


def _check_numerics(meta: dict, trained_cfg: dict | None, rep: Report) -> None:
    if not trained_cfg:
        rep.add("rope / norm", False, "the drafter's training config is unknown: rope base, norm eps and norm "
                "placement are not checked", "pass --trained-on CKPT", level="warning")
        return
    bad = []
    for key, name in _NUMERIC.items():
        got, want = meta.get(key), trained_cfg.get(name)
        if got is None or want is None:
            continue
        same = got == want if isinstance(want, bool) else abs(float(got) - float(want)) <= 1e-6 * max(abs(float(want)), 1e-12)
        if not same:
            bad.append(f"{key} is {got!r}, trained with {name} = {want!r}")
    rep.add("rope / norm", not bad, "; ".join(bad) or "rope base, rms eps and norm_before_residual match training",
            "re-export the drafter with `eaglewire export CKPT --format gguf`")
