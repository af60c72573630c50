"""A mistyped dataset path is named as missing (with the close one), by every command, and never created."""

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.cli import run_cli


@pytest.fixture
def runs(tmp_path, monkeypatch):
    (tmp_path / "runs" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


def test_every_reader_says_the_directory_does_not_exist(runs):
    from eaglewire.data.config import DataExtractConfig, DataVocabConfig
    from eaglewire.data.dataset import FeatureDataset
    from eaglewire.data.manifest import Manifest
    from eaglewire.data.pipeline import run_extract, run_vocab

    want = f"dataset directory {runs / 'dta'} does not exist (did you mean {runs / 'data'}?)"
    for call in (lambda: Manifest.load(runs / "dta"), lambda: FeatureDataset(runs / "dta"),
                 lambda: run_vocab(DataVocabConfig(data=runs / "dta")),
                 lambda: run_extract(DataExtractConfig(data=runs / "dta", target="tiny:llama", device="cpu"))):
        with pytest.raises(EaglewireError) as e:
            call()
        assert str(e.value) == want
    assert sorted(p.name for p in runs.iterdir()) == ["data"]  # the write lock did not create runs/dta


@pytest.mark.parametrize("args", [("data", "info", "runs/dta"), ("data", "vocab", "runs/dta"),
                                  ("doctor", "dataset", "runs/dta"),
                                  ("train", "--data", "runs/dta", "--out", "runs/x", "--device", "cpu")])
def test_cli_names_the_typo_as_typed(runs, args):
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stderr == "error: dataset directory runs/dta does not exist (did you mean runs/data?)\n"
    assert sorted(p.name for p in runs.iterdir()) == ["data"]


def test_no_close_name_no_guess(runs):
    from eaglewire.data.manifest import Manifest

    with pytest.raises(EaglewireError) as e:
        Manifest.load(runs / "zzz")
    assert str(e.value) == f"dataset directory {runs / 'zzz'} does not exist"
