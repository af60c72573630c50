"""A full disk while `data build` keeps generation's features (`gencapture.write`): one line naming the
folder (it was a SafetensorError traceback), the answers written so far kept, nothing claimed complete, no
half-written part left; simulated as tests/infra/test_disk_full.py does (the writer raises what it raises on
ENOSPC after a short write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.data import gencapture
from eaglewire.data.config import DataBuildConfig
from eaglewire.data.jsonl import read_jsonl
from eaglewire.data.pipeline import run_build
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.tinydata import USER_PROMPTS

pytestmark = pytest.mark.unit


def _safetensors_full(tensors, path, *a, **k):
    Path(path).write_bytes(b"\x08" * 64)
    raise Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space left\" })")


def test_a_full_disk_while_keeping_generation_features_is_one_line(tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in USER_PROMPTS))
    out = tmp_path / "ds"
    monkeypatch.setattr(gencapture, "save_file", _safetensors_full)
    with pytest.raises(EaglewireError, match=rf"^{out / gencapture.GENCAPTURE}: disk full while writing part-00000"
                       r"\.safetensors .*nothing marked complete") as e:
        run_build(DataBuildConfig(out=out, target="tiny:llama", prompts=prompts, max_new_tokens=8, batch_size=4,
                                  store_dtype="fp32", device="cpu", gen_capture=True))
    assert "\n" not in str(e.value)
    assert not (out / "manifest.json").exists()  # nothing claimed complete
    assert list((out / gencapture.GENCAPTURE).iterdir()) == []  # no half-written part
    assert [r for r in read_jsonl(out / "responses.jsonl") if "messages" in r]  # the batch's answers kept
