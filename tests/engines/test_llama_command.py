"""llama-server's command line: what `serve --print-command` prints is what runs."""

from __future__ import annotations

from pathlib import Path

from eaglewire.engines.llama_server import LlamaSpec, cpu_flags, llama_command


def _spec(**kw) -> LlamaSpec:
    return LlamaSpec(target_gguf=Path("t.gguf"), drafter_gguf=Path("d.gguf"), threads=2, **kw)


def test_repacking_is_off_on_amx_cpus_only():
    assert "--no-repack" in llama_command("llama-server", _spec(), flags={"avx2", "amx_int8", "amx_tile"})
    assert "--no-repack" not in llama_command("llama-server", _spec(), flags={"avx2", "fma"})
    assert "--no-repack" not in llama_command("llama-server", _spec(repack=True), flags={"amx_int8"})
    assert "--no-repack" in llama_command("llama-server", _spec(repack=False), flags={"avx2"})
    cmd = llama_command("llama-server", _spec(), flags=set())
    assert cmd[cmd.index("-md") + 1] == "d.gguf" and cmd[cmd.index("--spec-type") + 1] == "draft-eagle3"


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_int8\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_int8"}
    assert cpu_flags(tmp_path / "missing") == set()
