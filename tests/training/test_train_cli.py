"""`eaglewire train`'s options and printing: torch-free to import, one report per job."""

import json
import subprocess
import sys

import pytest

import eaglewire.training.loop as loop
from eaglewire.training.cli import run
from eaglewire.training.config import TrainConfig

RES = {"drafter": "r/drafter", "steps": 3, "validation": {"loss": 1.25, "acc": [0.5, 0.25]}}


def test_the_command_module_does_not_load_torch():
    code = "import sys, eaglewire.training.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("as_json", [True, False])
def test_rank_0_prints_the_result_and_other_ranks_stay_silent(monkeypatch, capsys, tmp_path, as_json):
    monkeypatch.setattr(loop, "run_train", lambda cfg: RES)
    cfg = TrainConfig(data=tmp_path, out=tmp_path / "r", json=as_json)
    monkeypatch.setenv("RANK", "1")
    run(cfg)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    run(cfg)
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out) == RES
    else:
        assert out == "drafter: r/drafter  steps 3  val loss 1.2500  acc_0..k 0.500 0.250\n"
