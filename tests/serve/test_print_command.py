"""`serve --print-command`: commands for the machine that will serve, parsed by the engines' own parsers.

Printing writes nothing and looks for no engine (the machine printing may be a laptop); the
engine's own dtype and memory defaults apply unless the user set them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from eaglewire.engines import vllm_env
from eaglewire.engines.sglang import launch_command
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import PINNED
from eaglewire_testing.cli import run_cli
from eaglewire_testing.engine_code import sources, wheel


@pytest.fixture
def run(tiny_drafter, tmp_path):
    ckpt, _ = tiny_drafter
    d = tmp_path / "run"
    shutil.copytree(ckpt, d / "drafter")
    return d


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _printed(run: Path, *extra) -> dict:
    before = _files(run)
    r = run_cli("serve", run, "--print-command", "--json", *extra)
    assert r.returncode == 0, r.stderr
    assert _files(run) == before, "printing wrote into the run"
    return json.loads(r.stdout)


def test_print_command_writes_nothing_and_leaves_dtype_and_memory_to_the_engine(run, tmp_path):
    res = _printed(run)
    cmd = shlex.split(res["command"])
    assert cmd[:2] == ["vllm", "serve"] and "--dtype" not in cmd and "--gpu-memory-utilization" not in cmd
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": res["export"], "num_speculative_tokens": 3}
    exp = shlex.split(res["export_command"])  # run as printed: it makes the directory the engine loads
    assert exp[:2] == ["eaglewire", "export"]
    r = run_cli(*exp[1:])
    assert r.returncode == 0, r.stderr
    assert (Path(res["export"]) / "config.json").is_file()


def test_given_dtype_and_memory_are_printed(run):
    cmd = shlex.split(_printed(run, "--dtype", "bfloat16", "--memory-fraction", "0.8")["command"])
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16" and cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.8"


def test_sglang_is_printed_with_the_chain_depth(run):
    res = _printed(run, "--engine", "sglang", "--depth", "4")
    cmd = shlex.split(res["command"])
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--speculative-num-steps") + 1] == "4" and cmd[cmd.index("--speculative-eagle-topk") + 1] == "1"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "5"
    assert "--format sglang" in res["export_command"] and cmd[cmd.index("--speculative-draft-model-path") + 1] == res["export"]


def test_sglang_without_print_command_is_one_line(run):
    r = run_cli("serve", run, "--engine", "sglang")
    assert r.returncode == 2 and "--print-command" in r.stderr and "Traceback" not in r.stderr


def test_a_cuda_machine_without_vllm_is_told_to_install_it_not_given_the_cpu_build(monkeypatch):
    monkeypatch.delenv("EAGLEWIRE_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_env, "_python_of_vllm_script", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_env, "ensure_managed", lambda timeout=0: pytest.fail("built the CPU-only venv on a GPU box"))
    with pytest.raises(EaglewireError, match=r"pip install vllm==0\.32\.0"):
        vllm_env.find_python()


@pytest.mark.integration  # vLLM's own argument parser, in the pinned venv
def test_vllms_own_parser_reads_the_printed_command(run, vllm_python):
    res = _printed(run, "--depth", "2")
    script = Path(__file__).resolve().parents[2] / "src" / "eaglewire_testing" / "vllm_cli_check.py"
    r = subprocess.run([str(vllm_python), str(script), *shlex.split(res["command"])[1:]], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    assert parsed["subparser"] == "serve" and parsed["model_tag"] == shlex.split(res["command"])[2]
    assert parsed["speculative_config"] == {"method": "eagle3", "model": res["export"], "num_speculative_tokens": 2}
    assert parsed["dtype"] == "auto" and parsed["host"] == "127.0.0.1"  # vLLM's own default dtype; loopback


@pytest.mark.integration  # SGLang's own argument definitions, from its pinned wheel
def test_every_printed_sglang_flag_is_one_sglang_defines():
    """SGLang 0.5.23 builds its CLI from dataclass fields (`srt/arg_groups/fields/`): --a-b is field a_b."""
    files = sources(wheel("sglang", PINNED["sglang"]), "sglang/srt/arg_groups/fields/")
    assert files, "the wheel moved its argument definitions: find them and point this test there"
    src = "\n".join(files.values())
    flags = [t for t in launch_command("T", "D", 3, tp=2) if t.startswith("--")]
    unknown = [f for f in flags if not re.search(rf"^\s+{f[2:].replace('-', '_')}\s*:", src, re.M)]
    assert len(flags) == 9 and unknown == [] and "EAGLE3" in src
