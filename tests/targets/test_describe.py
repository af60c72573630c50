"""`inspect` and `layers` as library calls: results returned, nothing printed, `layers` without torch (`capture`'s
library call is what the CLI test in test_load.py runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eaglewire.targets.config import InspectConfig
from eaglewire.targets.describe import inspect_target

pytestmark = pytest.mark.unit


def test_inspect_returns_its_report_and_prints_nothing(capsys, tiny_targets):
    r = inspect_target(InspectConfig(target="tiny:llama", device="cpu"))
    t = tiny_targets["llama"]
    assert (r["num_layers"], r["hidden_size"]) == (t.config.num_hidden_layers, t.config.hidden_size)
    assert capsys.readouterr().out == ""


def test_layers_converts_without_importing_torch():
    code = ("import sys; from eaglewire.targets.config import LayersConfig; from eaglewire.targets.layers import "
            "convert_layers; r = convert_layers(LayersConfig(ids=[2, 16, 29], target_layers=32, layers_from='vllm'));"
            " print(r['names'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['layers.1.out', 'layers.15.out', 'layers.28.out'] False"
