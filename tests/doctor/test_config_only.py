"""A config-only `doctor config` says which checks it skipped and why, in its table and in its JSON.

Without weights the tensor rows cannot run; an OK verdict that does not say so
reads as if the weights had been checked.
"""

from __future__ import annotations

import json
import shutil

import pytest

from eaglewire.doctor.engine_config import doctor_config
from eaglewire.saved.checkpoint import read_provenance
from eaglewire_testing.export_helpers import L, make_ckpt

pytestmark = pytest.mark.unit

WEIGHT_ROWS = ["tensors", "values", "sizes", "d2t", "fc"]  # the row names a full directory reports


def _run(d, ck, capsys, as_json):
    doctor_config(d, "sglang", L, read_provenance(ck).point_names, None, None).print(as_json)
    return capsys.readouterr().out


def test_config_only_names_the_skipped_checks(tmp_path, capsys):
    ck, _ = make_ckpt(tmp_path / "ck")
    full = doctor_config(ck, "sglang", L, read_provenance(ck).point_names, None, None)
    assert set(WEIGHT_ROWS) <= {c.name for c in full.checks} and "skipped" not in full.to_dict()
    d = tmp_path / "cfg"
    d.mkdir()
    shutil.copy(ck / "config.json", d / "config.json")
    text = _run(d, ck, capsys, False)
    row = next(line for line in text.splitlines() if "weights" in line)
    assert row.split()[0] == "WARN" and "skipped: tensors, values, sizes, d2t, fc" in row and "config only" in row
    js = json.loads(_run(d, ck, capsys, True))
    assert js["skipped"] == {"checks": WEIGHT_ROWS, "why": f"no *.safetensors in {d}: config only"}
    assert not set(WEIGHT_ROWS) & {c["name"] for c in js["checks"]}  # skipped, not passed
