"""`eaglewire generate` / `bench` with a P-EAGLE checkpoint: parallel decoding through the engine's request loop,
counted as vLLM counts (every round drafts K; accepted drafts counted up to the tokens kept), and refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import greedy_reference
from eaglewire.decoding import peagle as peagle_decoding
from eaglewire.decoding.engine import SpecConfig
from eaglewire.decoding.peagle import ParallelEngine
from eaglewire.drafter import DrafterConfig
from eaglewire.drafter.peagle import PEagleDrafter
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.targets.fingerprint import TargetFingerprint, chat_template_hash
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.cli import run_cli
from eaglewire_testing.export_helpers import provenance

pytestmark = pytest.mark.unit
PROMPT = "Tell me a story."


@pytest.fixture(scope="module")
def peagle_ckpt(tiny_targets, tmp_path_factory):
    """A random P-EAGLE drafter for tiny:llama (full vocabulary, the target's embedding), saved as train saves."""
    t = tiny_targets["llama"]
    cfg = DrafterConfig.from_target_config(t.config, draft_vocab_size=t.vocab_size)
    torch.manual_seed(0)
    model = PEagleDrafter(cfg, mask_token_id=t.vocab_size - 1)
    model.load_target_embedding(t.model.get_input_embeddings().weight)
    points = eagle3_default(t.num_layers)
    prov = provenance([p.name for p in points], t.num_layers, fingerprint=TargetFingerprint.of(t),
                      chat_template_sha=chat_template_hash(t.tokenizer))
    return save_checkpoint(tmp_path_factory.mktemp("peagle") / "drafter", model.eval(), prov), model, points


def _generate(ckpt, *extra):
    return run_cli("generate", "--target", "tiny:llama", "--drafter", ckpt, "--prompt", PROMPT, "--json", *extra)


def test_generate_is_parallel_greedy_with_vllm_counts(tiny_targets, peagle_ckpt):
    ckpt, model, points = peagle_ckpt
    t = tiny_targets["llama"]
    r = _generate(ckpt, "--max-new-tokens", "12", "--depth", "4")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ids = ParallelEngine(t, model, points).encode(PROMPT)
    assert d["token_ids"] == greedy_reference(t, ids, 12) and d["mode"] == "p-eagle" and d["depth"] == 4
    direct = ParallelEngine(t, model, points).generate(ids, SpecConfig(mode="chain", depth=4, max_new_tokens=12))
    acc = [s.accepted for s in direct.metrics.steps]
    assert d["drafting_rounds"] == len(acc) > 0 and d["accepted_per_pos"] == [sum(a > i for a in acc) for i in range(4)]
    assert d["drafted_per_round"] == 4  # every round drafts K, the last ones too


def test_every_round_drafts_k_and_counts_only_kept_drafts(tiny_targets, peagle_ckpt, monkeypatch):
    """An oracle drafter (the target's own greedy continuation) is accepted whole; with 3 tokens left after the
    prefill's one and K = 3 the round still drafts 3 (vLLM does not shorten a draft for max_tokens) but only the
    2 drafts the request keeps count as accepted, as vLLM counts them."""
    _, model, points = peagle_ckpt
    t = tiny_targets["llama"]
    eng = ParallelEngine(t, model, points)
    ids = eng.encode(PROMPT)
    ref = greedy_reference(t, ids, 12)
    seen = []

    def oracle(self, next_tokens, features, k):
        have = self.length + len(next_tokens) - len(ids) + 1  # generated tokens verified so far
        seen.append(k)
        return ref[have: have + k]

    monkeypatch.setattr(peagle_decoding.ParallelDrafter, "draft", oracle)
    r = eng.generate(ids, SpecConfig(mode="chain", depth=3, max_new_tokens=3))
    assert r.token_ids == ref[:3] and seen == [3]
    assert [(s.drafted, s.accepted, s.bonus) for s in r.metrics.steps] == [(3, 2, 0)]


@pytest.mark.parametrize("extra,message", [
    (("--top-k", "5", "--tree-depth", "3"), "--top-k, --tree-depth: EAGLE-3 draft-shape option.*P-EAGLE drafter"),
    (("--min-prob", "0.2"), "--min-prob: EAGLE-3 draft-shape option"),
    (("--lookup", "4"), "--lookup: EAGLE-3 draft-shape option"),
])
def test_generate_refuses_what_parallel_drafting_cannot_do(peagle_ckpt, extra, message):
    r = _generate(peagle_ckpt[0], *extra)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert re.search(message, r.stderr), r.stderr


def test_engine_refuses_a_tree(tiny_targets, peagle_ckpt):
    _, model, points = peagle_ckpt
    with pytest.raises(EaglewireError, match="mode 'tree': a P-EAGLE drafter drafts one chain"):
        ParallelEngine(tiny_targets["llama"], model, points).generate([1, 2, 3], SpecConfig(mode="tree"))


def test_bench_runs_parallel_decoding_beside_plain(peagle_ckpt, tmp_path):
    ckpt = peagle_ckpt[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hello, how are you?", "category": "chat"}\n')
    base = ("bench", "--target", "tiny:llama", "--drafter", ckpt, "--prompts", prompts, "--max-new-tokens", "8")
    r = run_cli(*base, "--json", "--methods", "eaglewire_plain", "--methods", "eaglewire_peagle")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["methods"]) == {"eaglewire_plain", "eaglewire_peagle"} and d["greedy_outputs_match"]
    row = d["methods"]["eaglewire_peagle"]
    assert d["config"]["drafter"] == "p-eagle" and row["drafting_rounds"] > 0 and len(row["accepted_per_pos"]) == 3
    r = run_cli(*base, "--methods", "eaglewire_tree")
    assert r.returncode == 2 and "--methods eaglewire_tree: needs an EAGLE-3 drafter" in r.stderr, r.stderr
    assert "a P-EAGLE one" in r.stderr, r.stderr
