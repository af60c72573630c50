"""`eaglewire serve` on a P-EAGLE checkpoint without an engine: vLLM's command carries parallel_drafting and the
trained depths, and the engines without P-EAGLE are refused in one line."""

from __future__ import annotations

import json
import shlex

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.peagle import vllm_speculative_config
from eaglewire.serve.config import ServeConfig
from eaglewire.serve.serving import run_serve

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An untrained P-EAGLE drafter (3 depths) of the vLLM-servable tiny target, saved as a checkpoint."""
    from eaglewire_testing.peagle_serving import build_peagle_run

    return build_peagle_run(tmp_path_factory.mktemp("peagle"), steps=0)


def _print(run, tmp_path, engine, depth=0):
    return run_serve(ServeConfig(drafter=run["ckpt"], engine=engine, out=tmp_path / "serve", print_command=True,
                                 depth=depth, json=True))


@pytest.mark.parametrize("depth,k", [(0, 3), (2, 2)])  # the trained depths unless --depth says otherwise
def test_vllm_command_drafts_in_parallel(run, tmp_path, depth, k):
    res = _print(run, tmp_path, "vllm", depth)
    argv = shlex.split(res["command"])
    sc = json.loads(argv[argv.index("--speculative-config") + 1])
    assert sc == vllm_speculative_config(tmp_path / "serve" / "vllm", k)
    assert res["depth"] == k and "--format vllm" in res["export_command"]
    assert not (tmp_path / "serve").exists()  # printing writes nothing


@pytest.mark.parametrize("engine,print_command", [("sglang", True), ("sglang", False), ("llama.cpp", False)])
def test_engines_without_peagle_are_refused(run, tmp_path, engine, print_command):
    cfg = ServeConfig(drafter=run["ckpt"], engine=engine, out=tmp_path / "serve", print_command=print_command)
    with pytest.raises(EaglewireError, match=f"a P-EAGLE drafter; {engine} has no parallel EAGLE drafting") as e:
        run_serve(cfg)
    assert "\n" not in str(e.value) and not (tmp_path / "serve").exists()
