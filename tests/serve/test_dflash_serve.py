"""`eaglewire serve` on a DFlash checkpoint without an engine: the commands printed, the refusals, and the
prediction counted the way vLLM counts a block drafter's rounds."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.serve.config import ServeConfig
from eaglewire.serve.serving import run_serve

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A briefly trained DFlash drafter (blocks of 4) of the vLLM-servable tiny target, saved as a checkpoint:
    60 steps, so that rounds accept some drafts and others none (the counting below meets both)."""
    from eaglewire_testing.dflash_serving import build_dflash_run

    return build_dflash_run(tmp_path_factory.mktemp("dflash"), steps=60)


def _print(run, tmp_path, engine, *extra):
    cfg = ServeConfig(drafter=run["ckpt"], engine=engine, out=tmp_path / "serve", print_command=True, json=True)
    for k, v in extra:
        setattr(cfg, k, v)
    return run_serve(cfg)


def test_vllm_command_names_the_dflash_method_and_the_block(run, tmp_path):
    res = _print(run, tmp_path, "vllm")
    argv = shlex.split(res["command"])
    sc = json.loads(argv[argv.index("--speculative-config") + 1])
    assert sc == {"method": "dflash", "model": str(tmp_path / "serve" / "vllm"), "num_speculative_tokens": 3}
    assert res["method"] == "dflash" and res["depth"] == 3 and "--format vllm" in res["export_command"]
    assert not (tmp_path / "serve").exists()  # printing writes nothing


def test_fewer_drafts_than_the_block_and_never_more(run, tmp_path):
    res = _print(run, tmp_path, "vllm", ("depth", 2))
    assert '"num_speculative_tokens": 2' in res["command"]
    with pytest.raises(EaglewireError, match=r"--depth 5: a DFlash drafter with block_size 4 drafts 1..3"):
        _print(run, tmp_path, "vllm", ("depth", 5))
    with pytest.raises(EaglewireError, match=r"--depth 5: .* block_size 4"):  # refused before any export or start
        run_serve(ServeConfig(drafter=run["ckpt"], out=tmp_path / "s2", depth=5, vllm_python="/nonexistent/python"))
    assert not (tmp_path / "s2").exists()


def test_sglang_command_is_dflash_with_the_verify_window(run, tmp_path):
    argv = shlex.split(_print(run, tmp_path, "sglang")["command"])
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--speculative-algorithm"] == "DFLASH"
    assert flags["--speculative-num-draft-tokens"] == "4"  # the block: bonus + 3 drafts
    assert "--speculative-num-steps" not in flags and "--speculative-eagle-topk" not in flags


@pytest.mark.parametrize("engine,printing,why", [
    ("llama.cpp", False, "starts and checks EAGLE-3 drafters only"),
    ("llama.cpp", True, "starts and checks EAGLE-3 drafters only"),
    ("sglang", False, "SGLang's DFLASH runs on CUDA only: pass --print-command"),
])
def test_engines_serve_cannot_check_refuse_in_one_line(run, tmp_path, engine, printing, why):
    cfg = ServeConfig(drafter=run["ckpt"], engine=engine, out=tmp_path / "serve", print_command=printing)
    with pytest.raises(EaglewireError, match=why) as e:
        run_serve(cfg)
    assert "\n" not in str(e.value) and "DFlash" in str(e.value)
    assert not (tmp_path / "serve").exists()


def _hand_count(rounds: list[int], max_new: int) -> tuple[int, list[int]]:
    """vLLM's counters from a round list (accepted drafts per round, unbounded): the first token comes from
    the prompt; each round keeps 1 + accepted tokens until max_new, and counts the accepted ones it kept."""
    left, drafts, per_pos = max_new - 1, 0, [0, 0, 0]
    for a in rounds:
        if left <= 0:
            break
        kept = min(a + 1, left)
        drafts += 1
        for p in range(min(a, kept)):
            per_pos[p] += 1
        left -= kept
    return drafts, per_pos


def test_prediction_drafts_every_slot_to_the_end_as_vllm(run):
    """The last rounds draft 3 whatever is left of max_tokens (vLLM does; the block engine alone drafts fewer
    there), and count what the request kept: against a hand count over the block engine's unbounded rounds."""
    import torch

    from eaglewire.decoding.engine import SpecConfig
    from eaglewire.doctor.dflash_live import DFlashPrediction
    from eaglewire.doctor.live import predicted_acceptance

    engine = DFlashPrediction(run["loaded"], run["drafter"])
    prompts, answers = run["prompts"][:2], run["answers"][:2]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        unbounded = [engine.block.generate(p, SpecConfig(mode="chain", depth=3, max_new_tokens=20)) for p in prompts]
        for max_new in (8, 9, 10):
            ours = predicted_acceptance(engine, prompts, 3, max_new)
            counts = [_hand_count([s.accepted for s in u.metrics.steps], max_new) for u in unbounded]
            assert ours.outputs == [a[:max_new] for a in answers]
            assert ours.drafts == sum(d for d, _ in counts), max_new
            assert ours.accepted_per_pos == [sum(pp[i] for _, pp in counts) for i in range(3)], max_new
            assert ours.draft_tokens == 3 * ours.drafts
    finally:
        torch.set_num_threads(threads)
    assert sum(ours.accepted_per_pos) > 0  # the counts mean something: drafts are accepted


def test_a_speculative_method_vllm_is_not_given_by_eaglewire_is_refused(tmp_path):
    from eaglewire.engines.vllm_server import ServeSpec, speculative_config

    spec = ServeSpec(target_dir=tmp_path, drafter_dir=tmp_path / "d", depth=3, method="dflash")
    assert speculative_config(spec) == {"method": "dflash", "model": str(tmp_path / "d"), "num_speculative_tokens": 3}
    with pytest.raises(EaglewireError, match="speculative method 'medusa': expected one of eagle3, dflash"):
        speculative_config(dataclasses.replace(spec, method="medusa"))


def test_an_explicit_depth_is_kept_and_only_the_default_means_the_whole_block():
    """`--depth 3` on a 16-token block drafts 3, as asked; only the default (0) drafts the block's 15 slots."""
    from eaglewire.serve.dflash import dflash_depth

    assert dflash_depth(0, 16) == 15 and dflash_depth(3, 16) == 3 and dflash_depth(15, 16) == 15
    with pytest.raises(EaglewireError, match="--depth 16: a DFlash drafter with block_size 16 drafts 1..15"):
        dflash_depth(16, 16)


def test_block_size_is_read_from_the_config_without_the_weights(tmp_path):
    """`serve` asks a DFlash checkpoint its block size before exporting: config.json answers it, so a checkpoint
    whose weights are absent still says 5 (the weights are the export's to read, and to refuse)."""
    from eaglewire.saved.checkpoint import WEIGHTS
    from eaglewire.serve.dflash import block_size
    from eaglewire_testing.dflash_export import make_dflash_ckpt

    ckpt, _ = make_dflash_ckpt(tmp_path / "ck", block_size=5)
    (ckpt / WEIGHTS).unlink()
    assert block_size(ckpt) == 5
