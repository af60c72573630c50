"""The commands as a user runs them: JSON on stdout, warnings also on stderr, errors in one line."""

from __future__ import annotations

import json
import subprocess
import sys

from support.export_helpers import make_ckpt


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
