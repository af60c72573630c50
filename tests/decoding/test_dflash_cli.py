"""`eaglewire generate` / `eaglewire bench` with a DFlash checkpoint: block decoding, vLLM's counts, refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import greedy_reference
from eaglewire.decoding.dflash import BlockEngine
from eaglewire.decoding.engine import SpecConfig
from eaglewire.drafter.dflash import DFlashConfig, DFlashDrafter
from eaglewire.saved.dflash import save_dflash_checkpoint
from eaglewire.targets.fingerprint import TargetFingerprint, chat_template_hash
from eaglewire_testing.cli import run_cli
from eaglewire_testing.export_helpers import provenance

pytestmark = pytest.mark.unit
PROMPT = "Tell me a story."


@pytest.fixture(scope="module")
def dflash_ckpt(tiny_targets, tmp_path_factory):
    """A random DFlash drafter for tiny:llama (blocks of 4, two draft layers), saved as `train` saves one."""
    t = tiny_targets["llama"]
    cfg = DFlashConfig.from_target_config(t.config, mask_token_id=t.vocab_size - 1, block_size=4, num_layers=2)
    torch.manual_seed(0)
    model = DFlashDrafter(cfg).eval()
    prov = provenance(cfg.points, t.num_layers, fingerprint=TargetFingerprint.of(t),
                      chat_template_sha=chat_template_hash(t.tokenizer))
    return save_dflash_checkpoint(tmp_path_factory.mktemp("dflash") / "drafter", model, prov), model


def _generate(ckpt, *extra):
    return run_cli("generate", "--target", "tiny:llama", "--drafter", ckpt, "--prompt", PROMPT, "--json", *extra)


def test_generate_greedy_reports_vllm_counts_and_speedup(tiny_targets, dflash_ckpt):
    ckpt, model = dflash_ckpt
    t = tiny_targets["llama"]
    r = _generate(ckpt, "--max-new-tokens", "12", "--depth", "2", "--vs-plain")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ids = BlockEngine(t, model).encode(PROMPT)
    assert d["token_ids"] == greedy_reference(t, ids, 12) and d["matches_plain"] is True
    assert d["mode"] == "dflash" and d["depth"] == 2 and d["block_size"] == 4
    direct = BlockEngine(t, model).generate(ids, SpecConfig(mode="chain", depth=2, max_new_tokens=12))
    acc = [s.accepted for s in direct.metrics.steps]  # what the CLI must have counted, from the engine itself
    assert d["drafting_rounds"] == len(acc) > 0
    assert d["acceptance_length"] == pytest.approx(sum(1 + a for a in acc) / len(acc))
    assert d["accepted_per_pos"] == [sum(a > i for a in acc) for i in range(2)]
    assert d["drafted_per_round"] == pytest.approx(sum(s.drafted for s in direct.metrics.steps) / len(acc))
    assert d["tokens_per_s"] > 0 and d["speedup_vs_plain"] == pytest.approx(d["tokens_per_s"] / d["plain_tokens_per_s"])


def test_generate_sampled_is_seeded(dflash_ckpt):
    ckpt, _ = dflash_ckpt
    runs = [_generate(ckpt, "--max-new-tokens", "10", "--temperature", "0.9", "--top-p", "0.9", "--seed", s)
            for s in ("3", "3", "4")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    toks = [json.loads(r.stdout)["token_ids"] for r in runs]
    assert toks[0] == toks[1] and len(toks[0]) == 10 and toks[0] != toks[2]


@pytest.mark.parametrize("extra,message", [
    (("--depth", "4"), "--depth 4: the DFlash drafter .* has block_size 4, so it drafts 1..3 tokens per round"),
    (("--top-k", "5", "--tree-depth", "3"), "--top-k, --tree-depth: EAGLE-3 draft-shape option"),
    (("--min-prob", "0.2"), "--min-prob: EAGLE-3 draft-shape option"),
    (("--lookup", "4"), "--lookup: EAGLE-3 draft-shape option"),
])
def test_generate_refuses_what_a_block_cannot_do(dflash_ckpt, extra, message):
    ckpt, _ = dflash_ckpt
    r = _generate(ckpt, *extra)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert re.search(message, r.stderr), r.stderr


def test_drafter_for_another_target_is_refused(dflash_ckpt):
    ckpt, _ = dflash_ckpt
    r = run_cli("generate", "--target", "tiny:qwen3", "--drafter", ckpt, "--prompt", PROMPT)
    assert r.returncode == 2 and "does not match target" in r.stderr and "--force" in r.stderr, r.stderr


def test_bench_runs_block_decoding_beside_plain(dflash_ckpt, tmp_path):
    ckpt, _ = dflash_ckpt
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hello, how are you?", "category": "chat"}\n'
                       '{"prompt": "Tell me a joke.", "category": "chat"}\n')
    base = ("bench", "--target", "tiny:llama", "--drafter", ckpt, "--prompts", prompts, "--max-new-tokens", "8")
    r = run_cli(*base, "--json", "--methods", "eaglewire_plain", "--methods", "eaglewire_dflash")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["methods"]) == {"eaglewire_plain", "eaglewire_dflash"} and d["greedy_outputs_match"]
    row = d["methods"]["eaglewire_dflash"]
    assert d["config"]["drafter"] == "dflash" and d["config"]["depth"] == 3 and d["config"]["block_size"] == 4
    assert row["speedup_vs_plain"] > 0 and row["drafting_rounds"] > 0 and len(row["accepted_per_pos"]) == 3
    for extra, msg in ((("--methods", "eaglewire_tree"), "--methods eaglewire_tree: needs an EAGLE-3 drafter"),
                       (("--auto-shape", "2"), "--auto-shape: EAGLE-3 draft-shape option")):
        bad = run_cli(*base, *extra)
        assert bad.returncode == 2 and msg in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
