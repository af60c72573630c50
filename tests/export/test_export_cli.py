"""The commands as a user runs them: JSON on stdout, warnings also on stderr, errors in one line."""

from __future__ import annotations

import json
import subprocess
import sys

from eaglewire_testing.export_helpers import make_ckpt


def _run(*args):
    return subprocess.run([sys.executable, "-c", "from eaglewire.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300)


def test_export_import_cli(tmp_path):
    ck, _ = make_ckpt(tmp_path / "ck")
    r = _run("export", str(ck), "--format", "sglang", "--out", str(tmp_path / "s"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == [1, 3, 4]
    assert json.loads(r.stdout)["engine"] == "sglang 0.5.23" and "warning" not in r.stderr
    r = _run("import", str(tmp_path / "s"), "--out", str(tmp_path / "i"), "--target-layers", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["points"] == ["layers.1.out", "layers.3.out", "layers.4.out"]
    r = _run("export", str(ck), "--format", "tensorrt", "--out", str(tmp_path / "t"))
    assert r.returncode == 2 and r.stderr.startswith("error: --format 'tensorrt': expected one of")


def test_force_never_deletes_a_foreign_directory_or_the_input(tmp_path):
    """Hardening: `--force` used to rename any --out aside and delete it, and could replace the source."""
    ck, _ = make_ckpt(tmp_path / "ck")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    r = _run("export", str(ck), "--format", "vllm", "--out", str(mine), "--force")
    assert r.returncode == 2 and "not an eaglewire export" in r.stderr and r.stderr.count("\n") == 1
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert _run("export", str(ck), "--format", "vllm", "--out", str(tmp_path / "v")).returncode == 0
    r = _run("export", str(ck), "--format", "vllm", "--out", str(tmp_path / "v"), "--force")  # an earlier export: fine
    assert r.returncode == 0 and "replaced the earlier export" in r.stderr
    r = _run("import", str(tmp_path / "v"), "--out", str(tmp_path / "v"), "--target-layers", "8", "--force")
    assert r.returncode == 2 and "never replaces the input" in r.stderr
    assert (tmp_path / "v" / "model.safetensors").is_file()
    r = _run("export", str(ck), "--format", "vllm", "--out", str(ck), "--force")
    assert r.returncode == 2 and "never replaces the input" in r.stderr and (ck / "eaglewire.json").is_file()


def test_a_checkpoint_imported_without_its_target_gets_one_line_errors_not_crashes(tmp_path):
    """`import --target-layers N` records no target: every consumer says so (and how to proceed) in one line."""
    ck, _ = make_ckpt(tmp_path / "ck")
    assert _run("export", str(ck), "--format", "sglang", "--out", str(tmp_path / "s")).returncode == 0
    assert _run("import", str(tmp_path / "s"), "--out", str(tmp_path / "i"), "--target-layers", "8").returncode == 0
    for args in (["generate", "--drafter", str(tmp_path / "i"), "--prompt", "hi", "--target", "tiny:llama"],
                 ["doctor", "drafter", str(tmp_path / "i"), "--data", str(tmp_path)]):
        r = _run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert "--target" in r.stderr or "--force" in r.stderr
