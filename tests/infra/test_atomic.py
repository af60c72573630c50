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
