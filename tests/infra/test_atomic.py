"""A file rewritten through `atomic_file` is the old one or the new one, never a torn one."""

import json
import os
from pathlib import Path

import pytest

from eaglewire.infra.atomic import atomic_file, write_json_atomic


def test_write_json_atomic_writes_indented_json_with_paths_as_strings(tmp_path):
    p = tmp_path / "m.json"
    write_json_atomic(p, {"a": 1, "where": Path("/x/y")})
    assert json.loads(p.read_text()) == {"a": 1, "where": "/x/y"}
    assert p.read_text().startswith("{\n  ")
    assert [f.name for f in tmp_path.iterdir()] == ["m.json"]  # no temporary left behind


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "m.json"
    write_json_atomic(p, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(p, {"v": object()}, default=None)  # not JSON: fails half-way through
    assert json.loads(p.read_text()) == {"v": 1}
    assert [f.name for f in tmp_path.iterdir()] == ["m.json"]


def test_atomic_file_syncs_before_the_rename(tmp_path, monkeypatch):
    p, events = tmp_path / "rows.jsonl", []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", p.exists())), real(fd)))
    with atomic_file(p) as f:
        f.write("x\n")
    assert events == [("fsync", False)] and p.read_text() == "x\n"


def test_artifacts_follow_the_umask_not_mkdtemp_or_safetensors(tmp_path):
    """Checkpoints and exports must be readable by a serving engine running as another user."""
    import os

    import torch
    from safetensors.torch import save_file

    from eaglewire.infra.atomic import atomic_dir

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "art") as d:
            save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))  # safetensors itself writes 0600
            (d / "sub").mkdir()
    finally:
        os.umask(old)
    assert (tmp_path / "art").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "art" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "art" / "sub").stat().st_mode & 0o777 == 0o755


def test_force_replaces_only_an_earlier_artifact_of_the_same_kind(tmp_path):
    import pytest

    from eaglewire.infra.atomic import check_replace
    from eaglewire.infra.errors import EaglewireError

    out = tmp_path / "out"
    assert check_replace(out, False, "eaglewire.export.json", "export") is None  # nothing there
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EaglewireError, match="already exists"):
        check_replace(out, False, "eaglewire.export.json", "export")
    with pytest.raises(EaglewireError, match="not an eaglewire export"):
        check_replace(out, True, "eaglewire.export.json", "export")
    (out / "eaglewire.export.json").write_text("{}")
    assert "replaced the earlier export" in check_replace(out, True, "eaglewire.export.json", "export")
    with pytest.raises(EaglewireError, match="never replaces the input"):
        check_replace(out, True, "eaglewire.export.json", "export", sources=(out,))
    with pytest.raises(EaglewireError, match="never replaces the input"):
        check_replace(tmp_path, True, "eaglewire.export.json", "export", sources=(out,))  # a parent of the input
    assert (out / "notes.txt").read_text() == "mine"
