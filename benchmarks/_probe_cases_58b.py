"""Issue 58 (second part) for `probe_hardening.py`: resumed or repeated runs use what was recorded or refuse
(item 2), imported ids and d2t (item 4, with issue 55's injective d2t), capture points checked when a dataset
is built or read (item 4), and a chat template rendered under a time bound (item 6).

Names start with `i58-` (run them alone with `--only i58-`); `item` is the position in the issue's "What to do".
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from _probe_cases import Case, need
from _probe_world import Res, World, cli, prompts, write

NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"


def _interrupted(w: World, d: Path) -> tuple[Path, Path]:
    """`data generate` on tiny:llama with 32 new tokens, killed after its first batch (2 of 4 answers)."""
    from eaglewire.data import generate as gen
    from eaglewire.data.config import DataGenerateConfig
    from eaglewire.data.pipeline import run_generate

    real, calls = gen.generate_batch, []

    def dies(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    p, out = prompts(d / "p.jsonl", 4), d / "out"
    gen.generate_batch = dies
    try:
        run_generate(DataGenerateConfig(out=out, target="tiny:llama", prompts=p, max_new_tokens=32, batch_size=2,
                                        device="cpu"))
    except KeyboardInterrupt:
        pass
    finally:
        gen.generate_batch = real
    return out, p


def _resume(**flags):
    def prep(w: World, d: Path) -> list:
        out, p = _interrupted(w, d)
        extra = [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)]
        return ["data", "generate", "--out", out, "--prompts", p, "--resume", "--gen-batch-size", 2, "--device", "cpu",
                *extra]
    return prep


def _extract_plain(w: World, d: Path) -> list:
    return ["data", "extract", w.copy(w.qwen_answers, d / "data"), "--device", "cpu"]


def _extract_other(w: World, d: Path) -> list:
    return [*_extract_plain(w, d), "--target", "tiny:llama"]


def _extracted_with_qwen(res: Res, w: World, d: Path) -> str:
    need(res.rc == 0, f"exit {res.rc}: {res.stderr.strip().splitlines()[-1:]}")
    src = json.loads((d / "data" / "manifest.json").read_text())["target"]["source"]
    need(src == "tiny:qwen3", f"extracted with {src!r}, the answers are tiny:qwen3's")
    return "extracted with the recorded target tiny:qwen3"


def _build_resume_other(w: World, d: Path) -> list:
    data = w.copy(w.llama_ds, d / "data")
    return ["data", "build", "--out", data, "--resume", "--target", "tiny:llama", "--max-new-tokens", 16,
            "--device", "cpu"]


def _demo_dir(d: Path) -> Path:
    from eaglewire.demo.config import PRESETS, DemoConfig
    from eaglewire.infra.options import save_config

    run = d / "demo"
    save_config(DemoConfig(preset="quick", target="tiny:llama", run_dir=run), run / "demo.config.json",
                {"preset_values": PRESETS["quick"]})
    return run


def _demo_other_preset(w: World, d: Path) -> list:
    return ["demo", "--preset", "standard", "--target", "tiny:llama", "--run-dir", _demo_dir(d), "--device", "cpu"]


def _demo_same(w: World, d: Path) -> list:
    return ["demo", "--preset", "quick", "--target", "tiny:llama", "--run-dir", _demo_dir(d), "--device", "cpu"]


def _demo_while_locked(w: World, d: Path, args) -> Res:
    """The first demo still running: its lock held (by this process) while the second starts."""
    fd = os.open(d / "demo" / ".eaglewire.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cli(args, d, 120)
    finally:
        os.close(fd)


def _vllm_export(w: World, d: Path, model=None) -> Path:
    """A vLLM export of `model` (default: the world's random checkpoint) as another tool would hand it over."""
    from eaglewire.export.config import ExportConfig
    from eaglewire.export.exporter import run_export
    from eaglewire.saved.checkpoint import save_checkpoint
    from eaglewire.targets.points import eagle3_default
    from eaglewire_testing.export_helpers import L, provenance

    ck = w.ckpt
    if model is not None:
        ck = save_checkpoint(d / "ck", model, provenance([p.name for p in eagle3_default(L)], L))
    run_export(ExportConfig(ckpt=ck, format="vllm", out=d / "src"))
    (d / "src" / "eaglewire.export.json").unlink()
    return d / "src"


def _ids_disagree(w: World, d: Path) -> list:
    src = _vllm_export(w, d)
    cfg = json.loads((src / "config.json").read_text())
    cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    write(src / "config.json", json.dumps(cfg))
    return ["import", src, "--out", d / "imp", "--target-layers", 8]


def _d2t_absolute(w: World, d: Path) -> list:
    import torch
    from safetensors.torch import load_file, save_file

    from eaglewire_testing.export_helpers import make_drafter

    ids = [i for i in range(57) if i % 7 != 3][:40]  # every id + its draft index stays inside the 97-token vocab
    m = make_drafter()
    m.set_draft_vocab(torch.tensor(ids))
    src = _vllm_export(w, d, m)
    sd = load_file(str(src / "model.safetensors"))
    sd["d2t"] = torch.tensor(ids)
    sd.pop("t2d")
    save_file(sd, str(src / "model.safetensors"))
    return ["import", src, "--out", d / "imp", "--target-layers", 8]


def _duplicate_model():
    """A drafter whose draft ids 0 and 1 both map to target id 10 (t2d as such a d2t makes it)."""
    import torch

    from eaglewire_testing.export_helpers import make_drafter

    m = make_drafter()
    m.set_draft_vocab(torch.arange(10, 50))
    with torch.no_grad():
        m.d2t[1] = 9
        m.t2d.zero_()
        m.t2d[m.draft_target_ids()] = True
    return m


def _export_duplicate(fmt: str):
    def prep(w: World, d: Path) -> list:
        from eaglewire.saved.checkpoint import save_checkpoint
        from eaglewire.targets.points import eagle3_default
        from eaglewire_testing.export_helpers import L, provenance

        ck = save_checkpoint(d / "ck", _duplicate_model(), provenance([p.name for p in eagle3_default(L)], L))
        return ["export", ck, "--format", fmt, "--out", d / "out", "--verifier", "org/target"]
    return prep


def _doctor_duplicate(w: World, d: Path) -> list:
    import torch
    from safetensors.torch import load_file, save_file

    ck = w.copy(w.drafter, d / "drafter")
    sd = load_file(str(ck / "model.safetensors"))
    ar = torch.arange(sd["d2t"].numel())
    sd["d2t"][5] = int(sd["d2t"][4]) + 4 - 5  # draft 5 -> draft 4's target id
    sd["t2d"].zero_()
    sd["t2d"][sd["d2t"] + ar] = True
    save_file(sd, str(ck / "model.safetensors"))
    return ["doctor", "drafter", ck, "--data", w.llama_ds, "--samples", 4]


def _doctor_fails_d2t(res: Res, w: World, d: Path) -> str:
    line = next((ln.strip() for ln in res.stdout.splitlines() if "d2t" in ln and ("FAIL" in ln or "PASS" in ln)), "")
    need(res.rc == 1 and line.startswith("FAIL") and "target id" in line, f"exit {res.rc}: {line or res.stdout[-200:]}")
    return line


def _points_build(w: World, d: Path) -> list:
    return ["data", "build", "--target", "tiny:llama", "--prompts", prompts(d / "p.jsonl", 2), "--out", d / "out",
            "--points", "layers.4.out,layers.1.out,layers.2.out", "--max-new-tokens", 4, "--device", "cpu"]


def _points_train(w: World, d: Path) -> list:
    data = w.copy(w.llama_ds, d / "data")
    man = json.loads((data / "manifest.json").read_text())
    man["points"]["names"] = list(reversed(man["points"]["names"]))
    write(data / "manifest.json", json.dumps(man))
    return ["train", "--data", data, "--out", d / "run", "--device", "cpu", "--max-steps", 1]


def _looping_template(w: World, d: Path) -> list:
    from eaglewire.targets.load import load_target

    t = d / "target"
    shutil.copytree(load_target("tiny:llama").path, t)
    write(t / "chat_template.jinja", NESTED)
    return ["data", "generate", "--target", t, "--prompts", prompts(d / "p.jsonl", 1), "--out", d / "out",
            "--max-new-tokens", 2, "--device", "cpu"]


def issue58b() -> list[Case]:
    resumed = "other settings than the existing data was made with"
    return [
        Case("i58-extract-takes-recorded-target", 2, _extract_plain, check=_extracted_with_qwen),
        Case("i58-extract-contradicting-target", 2, _extract_other,
             words=("generated by target 'tiny:qwen3'", "--target 'tiny:llama'"), protect=("data",)),
        Case("i58-generate-resume-other-max-new-tokens", 2, _resume(max_new_tokens=8),
             words=(resumed, "--max-new-tokens 8 (recorded: 32)"), protect=("out",)),
        Case("i58-generate-resume-other-target", 2, _resume(target="tiny:qwen3"),
             words=(resumed, "--target 'tiny:qwen3' (recorded: 'tiny:llama')"), protect=("out",)),
        Case("i58-build-resume-other-max-new-tokens", 2, _build_resume_other,
             words=(resumed, "--max-new-tokens 16 (recorded: 8)"), protect=("data",)),
        Case("i58-demo-other-preset", 2, _demo_other_preset,
             words=("started with other settings", "--preset 'standard' (recorded: 'quick')"), protect=("demo",)),
        Case("i58-demo-while-another-runs", 2, _demo_same, words=("another eaglewire process",),
             protect=("demo/demo.config.json",), run=_demo_while_locked),
        Case("i58-import-ids-disagree", 4, _ids_disagree, words=("[2, 4, 5] at the top level", "[1, 2, 3] under eagle_config")),
        Case("i58-import-d2t-absolute-in-range", 4, _d2t_absolute, words=("reads both as offsets", "absolute target ids")),
        Case("i58-export-d2t-duplicate-vllm", 4, _export_duplicate("vllm"), words=("d2t maps two draft ids to target id 10",)),
        Case("i58-export-d2t-duplicate-gguf", 4, _export_duplicate("gguf"), words=("d2t maps two draft ids to target id 10",)),
        Case("i58-doctor-drafter-d2t-duplicate", 4, _doctor_duplicate, check=_doctor_fails_d2t),
        Case("i58-build-points-out-of-order", 4, _points_build, words=("not in ascending depth", "--points")),
        Case("i58-train-points-out-of-order", 4, _points_train, words=("manifest.json", "not in ascending depth")),
        Case("i58-chat-template-nested-loops", 6, _looping_template, words=("chat_template.jinja", "did not finish"),
             timeout=90),
    ]
