"""Issue 26 items 5-7 for `probe_hardening.py`: bad files, broken weights and ids, permissions."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

from _probe_cases import Case, _plan_cfg, need
from _probe_world import Res, World, write

L = 8  # the layer count of the export helpers' made-up target


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_OPTIMIZER_PT",))


def _sglang(w: World, d: Path, config: bytes | None = None, edit=None, ids=None) -> Path:
    """A copy of the SGLang export with its config replaced, its weights edited or its layer ids replaced."""
    src = w.copy(w.export("sglang"), d / "src")
    if ids is not None:
        cfg = json.loads((src / "config.json").read_text())
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        config = json.dumps(cfg).encode()
    if config is not None:
        write(src / "config.json", config)
    if edit is not None:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(src / "model.safetensors"))
        edit(sd)
        save_file(sd, str(src / "model.safetensors"))
    return src


def _config_with(w: World, d: Path, **change) -> bytes:
    cfg = json.loads((w.export("sglang") / "config.json").read_text())
    return json.dumps({**cfg, **change}).encode()


def _weights(kind: str):
    def prep(w: World, d: Path) -> list:
        from eaglewire_testing.export_helpers import break_weights

        src = _sglang(w, d)
        break_weights(src / "model.safetensors", kind)
        return _doctor(src)
    return prep


def _doctor(src: Path) -> list:
    return ["doctor", "config", src, "--engine", "sglang", "--target-layers", L, "--json"]


def _imp(src: Path, d: Path) -> list:
    return ["import", src, "--out", d / "imp", "--target-layers", L]


def _fails(row: str, *words):
    """`doctor config --json`: a non-zero exit and row `row` FAIL, its detail holding `words`."""
    def check(res: Res, w: World, d: Path) -> str:
        need(res.rc not in (0, None), f"exit {res.rc}: the doctor passes it")
        rep = json.loads(res.stdout)
        bad = {c["name"]: c["detail"] for c in rep["checks"] if not c["ok"]}
        need(row in bad, f"row {row!r} is not a FAIL (failing: {sorted(bad)})")
        need(all(x in bad[row] for x in words), f"{row}: {bad[row][:120]!r} lacks {words}")
        return f"FAIL {row}: {bad[row][:70]}"
    return check


def _clean(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stdout[-200:]}")
    return f"{len(json.loads(res.stdout)['checks'])} rows, none FAIL"


def _no_import(res: Res, w: World, d: Path) -> None:
    need(not (d / "imp").exists(), "an eaglewire checkpoint was written anyway")


def _bad_provenance(content: bytes):
    def prep(w: World, d: Path) -> list:
        dr = w.copy(w.drafter, d / "dr")
        write(dr / "eaglewire.json", content)
        return ["generate", "--drafter", dr, "--target", "tiny:llama", "--prompt", "hi", "--max-new-tokens", 2]
    return prep


def _online_rows(rows: bytes):
    def prep(w: World, d: Path) -> list:
        data = w.copy(w.llama_answers, d / "data")
        write(data / "responses.jsonl", rows)
        return ["train", "--online", "--target", "tiny:llama", "--data", data, "--out", d / "run", "--max-steps", 1,
                "--device", "cpu", "--vocab-size", 50]
    return prep


def _evil_optimizer(w: World, d: Path) -> list:
    run = w.killed_run(d)
    (run / "state" / "optimizer.pt").write_bytes(pickle.dumps(_Evil(), protocol=2))
    return ["train", "--data", w.llama_ds, "--out", run, "--device", "cpu", "--max-steps", 2, "--save-every", 1, "--resume"]


def _bench_category(w: World, d: Path) -> list:
    p = write(d / "p.jsonl", '{"prompt": "a", "category": "math"}\n{"prompt": "b", "category": ["x", "y"]}\n')
    return ["bench", "--drafter", w.copy(w.drafter, d / "dr"), "--target", "tiny:llama", "--prompts", p,
            "--max-new-tokens", 2, "--methods", "eaglewire_plain", "--out", d / "b"]


def _mla_missing(w: World, d: Path) -> list:
    cfg = w.target_config("deepseek_v3")
    need(cfg.get("kv_lora_rank"), "the tiny deepseek_v3 config has no kv_lora_rank")
    return _plan_cfg(w, d, "deepseek_v3", drop=("qk_rope_head_dim",), model_type="my_mla_arch",
                     architectures=["MyMlaForCausalLM"])


def item5() -> list[Case]:
    cfg = lambda **kw: lambda w, d: _imp(_sglang(w, d, _config_with(w, d, **kw)), d)  # noqa: E731
    raw = lambda content: lambda w, d: _imp(_sglang(w, d, content), d)  # noqa: E731
    not_utf8 = lambda w, d: _imp(_sglang(w, d, _config_with(w, d, note="x").replace(b'"x"', b'"caf\xe9"')), d)  # noqa
    online = ("responses.jsonl:1", "messages")
    return [
        Case("import-config-string-for-number", 5, cfg(hidden_size="abc"), words=("config.json", "hidden_size"),
             post=_no_import, protect=("src",)),
        Case("import-config-garbage", 5, raw(b"{oops"), words=("config.json",), post=_no_import),
        Case("import-config-not-utf8", 5, not_utf8, words=("config.json",), post=_no_import),
        Case("import-config-list", 5, raw(b"[1, 2]"), words=("config.json",), post=_no_import),
        Case("doctor-config-intact-export", 5, lambda w, d: _doctor(_sglang(w, d)), check=_clean),
        Case("doctor-config-garbage-weights", 5, _weights("garbage"), check=_fails("weights", "cannot be read")),
        Case("doctor-config-weights-directory", 5, _weights("directory"), check=_fails("weights", "cannot be read")),
        Case("doctor-config-weights-symlink-loop", 5, _weights("loop"), check=_fails("weights", "cannot be read")),
        Case("generate-garbage-provenance", 5, _bad_provenance(b"garbage{"), words=("eaglewire.json",)),
        Case("generate-provenance-list", 5, _bad_provenance(b"[1, 2]"), words=("eaglewire.json",)),
        Case("generate-provenance-points-int", 5, _bad_provenance(
            b'{"format": "eaglewire-drafter", "version": 1, "points": 5}'), words=("eaglewire.json", "points")),
        Case("bench-category-list", 5, _bench_category, words=("p.jsonl:2", "category")),
        Case("plan-heads-0", 5, lambda w, d: _plan_cfg(w, d, num_attention_heads=0),
             words=("config.json", "num_attention_heads")),
        Case("plan-hidden-size-abc", 5, lambda w, d: _plan_cfg(w, d, hidden_size="abc"), words=("config.json", "hidden_size")),
        Case("plan-hidden-size-infinity", 5, lambda w, d: _plan_cfg(w, d, hidden_size=float("inf")),
             words=("config.json", "hidden_size")),
        Case("plan-vocab-size-nan", 5, lambda w, d: _plan_cfg(w, d, vocab_size=float("nan")),
             words=("config.json", "vocab_size")),
        Case("plan-mla-field-missing", 5, _mla_missing, words=("config.json", "qk_rope_head_dim")),
        Case("online-messages-string", 5, _online_rows(b'{"index": 0, "messages": "hello"}\n'), words=online),
        Case("online-messages-null", 5, _online_rows(b'{"index": 0, "messages": null}\n'), words=online),
        Case("online-rows-not-utf8", 5, _online_rows(b'{"index": 0, "messages": []}\n{"index": 1, "x": "\xff"}\n'),
             words=("responses.jsonl:2",)),
        Case("train-resume-malicious-optimizer-pt", 5, _evil_optimizer, words=("optimizer.pt",), timeout=180,
             post=lambda res, w, d: need(not (d / "PWNED_BY_OPTIMIZER_PT").exists(), "the pickle's code RAN")),
    ]


# ---------------------------------------------------------------------------------------------- item 6


def _nan(sd):
    sd["fc.weight"].view(-1)[3] = float("nan")


def _all_nan(sd):
    sd["norm.weight"].fill_(float("nan"))


def _int32(sd):
    sd["fc.weight"] = sd["fc.weight"].to(__import__("torch").int32)


def _extra(sd):
    sd["midlayer.extra.weight"] = __import__("torch").ones(2)


def _no_target(cmd: str):
    def prep(w: World, d: Path) -> list:
        ck = w.copy(w.imported_no_target, d / "imp")
        return {"generate": ["generate", "--drafter", ck, "--target", "tiny:llama", "--prompt", "hi", "--max-new-tokens", 2],
                "bench": ["bench", "--drafter", ck, "--target", "tiny:llama", "--max-new-tokens", 2, "--max-prompts", 1,
                          "--methods", "eaglewire_plain", "--out", d / "b"],
                "doctor": ["doctor", "drafter", ck, "--data", w.llama_ds]}[cmd]
    return prep


def item6() -> list[Case]:
    imp = lambda edit: lambda w, d: _imp(_sglang(w, d, edit=edit), d)  # noqa: E731
    doc = lambda edit: lambda w, d: _doctor(_sglang(w, d, edit=edit))  # noqa: E731
    ids = [2.5, 4, 5]
    return [
        Case("import-one-nan-weight", 6, imp(_nan), words=("fc.weight",), post=_no_import),
        Case("import-all-nan-weight", 6, imp(_all_nan), words=("norm.weight",), post=_no_import),
        Case("import-int32-weight", 6, imp(_int32), words=("fc.weight", "int32"), post=_no_import),
        Case("doctor-config-one-nan-weight", 6, doc(_nan), check=_fails("values", "fc.weight")),
        Case("doctor-config-all-nan-weight", 6, doc(_all_nan), check=_fails("values", "norm.weight")),
        Case("doctor-config-int32-weight", 6, doc(_int32), check=_fails("values", "fc.weight", "int32")),
        Case("doctor-config-missing-norm-weight", 6, doc(lambda sd: sd.pop("norm.weight")),
             check=_fails("tensors", "norm.weight")),
        Case("doctor-config-extra-tensor", 6, doc(_extra), check=_fails("tensors", "midlayer.extra.weight")),
        Case("doctor-config-ids-2.5-4-5", 6, lambda w, d: _doctor(_sglang(w, d, ids=ids)),
             words=("eagle_aux_hidden_state_layer_ids", "2.5")),
        Case("import-ids-2.5-4-5", 6, lambda w, d: _imp(_sglang(w, d, ids=ids), d),
             words=("2.5",), post=_no_import),
        Case("plan-moe-experts-per-tok-over-experts", 6, lambda w, d: _plan_cfg(
            w, d, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=8),
             words=("config.json", "num_experts_per_tok")),
        Case("imported-without-target-generate", 6, _no_target("generate"), words=(("--target", "--force"),)),
        Case("imported-without-target-bench", 6, _no_target("bench"), words=(("--target", "--force"),)),
        Case("imported-without-target-doctor-drafter", 6, _no_target("doctor"), words=(("--target", "--force"),)),
    ]


# ---------------------------------------------------------------------------------------------- item 7


def _modes(root: str, dmode: int, fmode: int):
    def check(res: Res, w: World, d: Path) -> str:
        need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip()[-200:]}")
        top = d / root
        paths = [top, *top.rglob("*")]
        bad = [f"{p.relative_to(d)} {p.stat().st_mode & 0o777:o}" for p in paths
               if p.stat().st_mode & 0o777 != (dmode if p.is_dir() else fmode)]
        need(not bad, f"expected {dmode:o}/{fmode:o}: {', '.join(bad[:4])}")
        return f"{len(paths)} paths {dmode:o}/{fmode:o}"
    return check


def item7() -> list[Case]:
    export = lambda w, d: ["export", w.copy(w.ckpt, d / "ck"), "--format", "vllm", "--out", d / "out"]  # noqa: E731
    return [
        Case("perm-export-umask-022", 7, export, check=_modes("out", 0o755, 0o644), umask=0o022),
        Case("perm-export-umask-077", 7, export, check=_modes("out", 0o700, 0o600), umask=0o077),
        Case("perm-import-umask-022", 7, lambda w, d: ["import", w.copy(w.export("sglang"), d / "src"), "--out", d / "out",
                                                       "--target-layers", L],
             check=_modes("out", 0o755, 0o644), umask=0o022),
        Case("perm-train-checkpoint-umask-022", 7, lambda w, d: ["train", "--data", w.llama_ds, "--out", d / "run",
                                                                 "--max-steps", 1, "--device", "cpu"],
             check=_modes("run", 0o755, 0o644), umask=0o022, timeout=180),
    ]
