"""The README cannot rot: its pipeline is what the demo runs, it runs, and every command it shows parses."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from eaglewire.demo.commands import demo_steps, print_commands
from eaglewire.demo.config import PRESETS
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.e2e  # the README's commands, walked as a user runs them

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# the README's quick pipeline, shrunk to a tiny target: each rule names the flag it shrinks
SHRINK = [
    (r"--target default", "--target tiny:llama"),
    (r"--topic-prompts \d+", "--topic-prompts 12"),
    (r"--max-new-tokens \d+", "--max-new-tokens 12"),
    (r"--gen-batch-size \d+", "--gen-batch-size 12"),
    (r"--epochs \d+", "--epochs 1"),
    (r"--max-len \d+", "--max-len 128"),
    (r"--samples \d+", "--samples 4"),
    (r"--max-prompts \d+", "--max-prompts 2"),
]


def readme_pipeline() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- demo-commands:quick -->\n```bash\n(.*?)```\n<!-- /demo-commands -->", text, re.S)
    assert m, "README.md: the quick pipeline block (<!-- demo-commands:quick -->) is missing"
    return m.group(1).strip().splitlines()


def test_readme_pipeline_is_exactly_what_the_quick_preset_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root, wherever pytest started
    want = print_commands(demo_steps("default", PRESETS["quick"], Path("runs/demo-quick"))).splitlines()
    assert readme_pipeline() == want, "README.md is stale: paste `eaglewire demo --print-commands` into its block"


def test_the_readme_pipeline_runs_on_a_tiny_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").symlink_to(ROOT / "src")  # the README runs from the repository root
    lines = readme_pipeline()
    assert [shlex.split(x)[1] for x in lines][:2] == ["data", "train"]
    for line in lines:
        for pat, repl in SHRINK:
            line = re.sub(pat, repl, line)
        args = shlex.split(line)[1:]
        r = run_cli(*args)
        assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert (tmp_path / "runs/demo-quick/bench/bench.json").is_file()
    assert (tmp_path / "runs/demo-quick/export/vllm/config.json").is_file()


def _commands(path: Path) -> list[tuple[int, list[str]]]:
    """`eaglewire ...` lines in code blocks (continuations joined, comments and `$ ` prompts dropped)."""
    out, block, buf, start = [], False, "", 0
    for k, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("```"):
            block = not block
            continue
        if not block:
            continue
        line = raw.split("  #")[0].rstrip()
        line = line[2:] if line.startswith("$ ") else line
        if buf:
            buf += " " + line.rstrip("\\").strip()
        elif re.match(r"(torchrun .*-m eaglewire\.cli|eaglewire) ", line.strip()):
            buf, start = line.strip().rstrip("\\"), k
        if buf and not line.endswith("\\"):
            toks = shlex.split(buf.replace("...", ""))
            toks = toks[toks.index("eaglewire.cli") + 1:] if "eaglewire.cli" in toks else toks[1:]
            out.append((start, toks))
            buf = ""
    return out


def _command_params(toks: list[str]):
    import typer.main

    from eaglewire.cli import app

    group = typer.main.get_command(app)
    cmd, rest = group, toks
    while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
        cmd, rest = cmd.commands[rest[0]], rest[1:]
    assert cmd is not group, f"unknown command {toks[:2]}"
    flags = {o: not getattr(p, "is_flag", False) for p in cmd.params if not getattr(p, "hidden", False)
             for o in (*p.opts, *p.secondary_opts)}  # hidden = a deprecated alias: docs must use the name
    return cmd, rest, flags  # flag -> whether it takes a value


def _unknown(rest: list[str], flags: dict) -> list[str]:
    out, skip = [], False
    for t in rest:
        if skip:  # a value, even one that starts with -- (--engine-args '--enable-expert-parallel')
            skip = False
            continue
        name = t.split("=")[0]
        if t.startswith("--"):
            if name not in flags:
                out.append(name)
            skip = flags.get(name, False) and "=" not in t
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_shown_in_the_docs_parses(doc):
    """Each `eaglewire` line names a real command and only flags it takes under their current names."""
    bad = []
    for k, toks in _commands(doc):
        try:
            _, rest, flags = _command_params(toks)
        except AssertionError as e:
            bad.append(f"{doc.name}:{k}: {e}")
            continue
        unknown = _unknown(rest, flags)
        if unknown:
            bad.append(f"{doc.name}:{k}: {' '.join(toks[:2])} has no {', '.join(unknown)}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_the_commands_and_catches_an_old_flag(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("```bash\neaglewire data vocab runs/d --size 4096   # old name\n"
                   "torchrun --nproc_per_node 2 -m eaglewire.cli train --data d \\\n    --out r --epochs 2\n```\n")
    cmds = _commands(doc)
    assert [c[1][:2] for c in cmds] == [["data", "vocab"], ["train", "--data"]]
    _, rest, flags = _command_params(cmds[0][1])
    assert "--size" not in flags and "--vocab-size" in flags  # the old name is a hidden alias, not a shown flag


def _layout() -> dict[str, set[str]]:
    """Room -> modules, as the README's Layout block lists them (notes in parentheses dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Layout.*?```\n(.*?)```", text, re.S).group(1)
    rooms: dict[str, str] = {}
    room = None
    for line in block.splitlines():
        m = re.match(r"^  ([a-z_]+)/\s+(.*)$", line)
        if m and m.group(1) != "bench_prompts":
            room = m.group(1)
            rooms[room] = m.group(2)
        elif room and re.match(r"^ {10,}\S", line):
            rooms[room] += " " + line.strip()
        else:
            room = None
    out = {}
    for name, desc in rooms.items():
        while re.search(r"\([^()]*\)", desc):
            desc = re.sub(r"\([^()]*\)", "", desc)
        listed = desc.split(":", 1)[1] if ":" in desc else desc
        out[name] = {w.strip().rstrip("/") for w in listed.split(",") if w.strip()}
    return out


def test_the_readme_layout_names_every_folder_and_module_of_the_package():
    src = ROOT / "src" / "eaglewire"
    tree = {d.name: {p.stem for p in d.iterdir() if p.name != "__init__.py" and p.name != "__pycache__"
                     and (p.suffix == ".py" or p.is_dir())}
            for d in src.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    assert _layout() == tree


def test_the_layout_check_sees_a_missing_module():
    layout = _layout()
    assert "points" in layout["targets"] and "engines" in layout and len(layout) >= 10


# the scaling recipe on a tiny target and two CPU ranks: each rule names the flag it shrinks
SCALE_SHRINK = [
    (r"--nproc_per_node 8", "--nproc_per_node 2"),
    (r"--concurrency \d+", "--concurrency 4 --max-new-tokens 16"),
    (r"--config recipes/", f"--epochs 1 --config {ROOT}/recipes/"),
]


def scaling_recipe() -> list[str]:
    """The README's scaling recipe, one command per line (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- scaling-recipe -->\n```\n(.*?)```\n<!-- /scaling-recipe -->", text, re.S)
    assert m, "README.md: the scaling recipe block (<!-- scaling-recipe -->) is missing"
    joined = re.sub(r"\\\n\s*", "", m.group(1))
    return [ln.split("  #")[0].strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_readme_scaling_recipe_runs_on_a_tiny_target(tmp_path, monkeypatch):
    """Every step a GPU user copies, in order, on tiny:llama: served answers, sharded features, the
    vocabulary, DDP training. A step left out of the recipe (the draft vocabulary was) fails here."""
    import contextlib
    import os
    import subprocess
    import sys

    from eaglewire.targets.load import resolve_target_dir
    from eaglewire_testing.serve import free_port, transformers_server
    from eaglewire_testing.tinydata import USER_PROMPTS

    monkeypatch.chdir(tmp_path)
    target = str(resolve_target_dir("tiny:llama"))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{USER_PROMPTS[i % len(USER_PROMPTS)]} ({i})"})
                                                    + "\n" for i in range(24)))  # > one global batch of 2 ranks
    lines = scaling_recipe()
    assert any("data vocab" in ln for ln in lines) and any(ln.startswith("torchrun") for ln in lines)
    with contextlib.ExitStack() as servers:
        url = None
        for line in lines:
            for pat, repl in SCALE_SHRINK:
                line = re.sub(pat, repl, line)
            args = [target if a == "T" else a.replace("T/", target + "/") for a in shlex.split(line)]
            if args[:2] == ["vllm", "serve"]:  # the tiny target served by `transformers serve` instead
                url = servers.enter_context(transformers_server(Path(target), tmp_path / "serve.log"))
                continue
            if args[0] == "kill":
                servers.close()
                continue
            args = [a.replace("http://localhost:8000", url) if url else a for a in args]
            if args[0] == "torchrun":
                cmd = [sys.executable, "-m", "torch.distributed.run", *args[1:3], "--master_port", str(free_port()),
                       *args[3:]]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
            else:
                r = run_cli(*args[1:])
            assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert (tmp_path / "runs/train/drafter/config.json").is_file()
    assert json.loads((tmp_path / "runs/train/train.config.json").read_text())["config"]["lr"] == 1e-4  # the recipe


def test_the_readme_layers_sample_is_the_real_output():
    """Before: the sample had no llama.cpp column and an elided, garbled warning ('sglang < 0.5.13 on most targets,
    sglang < 0.5.13 on DeepSeek-family targets, ...'): the block after `$ eaglewire layers ...` is compared whole."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```bash\n\$ eaglewire (layers [^\n]*)\n(.*?)```", text, re.S)
    assert m, "README.md: the `$ eaglewire layers ...` sample is missing"
    r = run_cli(*shlex.split(m.group(1)))
    assert r.returncode == 0, r.stderr
    assert m.group(2) == r.stdout + r.stderr, "README.md's layers sample is stale: paste the command's output"
    out = r.stdout + r.stderr
    assert out.count("SGLang < 0.5.13") == 1 and "(any target)" in out and "llama.cpp" in out.splitlines()[1]
