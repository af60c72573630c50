"""Drafter/target compatibility checks and the generate / bench commands."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import random_drafter
from eaglewire.cli import app
from eaglewire.decoding.compat import load_drafter_for
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import save_checkpoint
from eaglewire.targets.fingerprint import TargetFingerprint, chat_template_hash
from eaglewire.targets.points import eagle3_default
from eaglewire_testing.export_helpers import provenance


@pytest.fixture(scope="module")
def llama_ckpt(tiny_targets, tmp_path_factory):
    t = tiny_targets["llama"]
    out = tmp_path_factory.mktemp("ckpt") / "drafter"
    names = [p.name for p in eagle3_default(t.num_layers)]
    prov = provenance(names, t.num_layers, fingerprint=TargetFingerprint.of(t), chat_template_sha=chat_template_hash(t.tokenizer))
    return save_checkpoint(out, random_drafter(t), prov)


def test_matching_drafter_loads(tiny_targets, llama_ckpt):
    drafter, points, _ = load_drafter_for(tiny_targets["llama"], llama_ckpt)
    assert [p.name for p in points] == [p.name for p in eagle3_default(8)]


def test_fingerprint_refusal_and_force(tiny_targets, llama_ckpt):
    other = tiny_targets["qwen3"]
    with pytest.raises(EaglewireError, match="does not match target.*fingerprint.*--force"):
        load_drafter_for(other, llama_ckpt)
    with pytest.warns(UserWarning, match="forced"):
        load_drafter_for(other, llama_ckpt, force=True)


def test_points_mismatch_refused(tiny_targets, llama_ckpt, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(llama_ckpt, bad)
    prov = json.loads((bad / "eaglewire.json").read_text())
    prov["points"]["names"] = ["layers.1.out", "layers.30.out", "layers.4.out"]
    (bad / "eaglewire.json").write_text(json.dumps(prov))
    with pytest.raises(EaglewireError, match="capture points"):
        load_drafter_for(tiny_targets["llama"], bad)


def test_generate_cli_json(tiny_targets, llama_ckpt):
    r = CliRunner().invoke(app, ["generate", "--target", "tiny:llama", "--drafter", str(llama_ckpt),
                                 "--prompt", "Hello", "--max-new-tokens", "8", "--json", "--mode", "chain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for k in ("text", "token_ids", "tau", "accept_per_position", "tokens_per_s", "time_s", "accept_hist"):
        assert k in d
    assert len(d["token_ids"]) == 8
    r = CliRunner().invoke(app, ["generate", "--target", "tiny:llama", "--prompt", " ", "--json"])
    assert r.exit_code != 0 and "empty" in str(r.exception)


def test_bench_cli(tiny_targets, llama_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hello, how are you?", "category": "chat"}\n'
                       '{"messages": [{"role": "user", "content": "Tell me a story."}], "category": "writing"}\n'
                       '{"prompt": "Tell me a joke.", "category": "chat"}\n')
    r = CliRunner().invoke(app, ["bench", "--target", "tiny:llama", "--drafter", str(llama_ckpt), "--prompts",
                                 str(prompts), "--max-new-tokens", "8", "--out", str(tmp_path / "b"), "--json",
                                 "--repeats", "2", "--methods", "hf_generate", "--methods", "eaglewire_plain",
                                 "--methods", "hf_prompt_lookup", "--methods", "eaglewire_chain", "--methods", "eaglewire_tree",
                                 "--min-prob", "0"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d["methods"]) == {"hf_generate", "eaglewire_plain", "hf_prompt_lookup", "eaglewire_chain", "eaglewire_tree"}
    assert d["greedy_outputs_match"], d
    assert d["config"]["min_prob"] == 0.0 and d["methods"]["eaglewire_tree"]["rounds_without_drafts"] == 0
    assert set(d["categories"]) == {"chat", "writing"} and d["categories"]["chat"]["prompts"] == 2
    tree = d["methods"]["eaglewire_tree"]
    assert tree["speedup_spread"]["n"] == 2 and tree["speedup_spread"]["min"] <= tree["speedup"] <= tree["speedup_spread"]["max"]
    assert d["methods"]["eaglewire_plain"]["speedup_vs_plain"] == 1.0
    assert d["plain_vs_hf_generate"] == d["methods"]["eaglewire_plain"]["speedup"]
    # the tau of all prompts is the step-weighted mix of the categories' taus
    assert min(c["eaglewire_tree"]["tau"] for c in d["categories"].values()) <= tree["tau"] \
        <= max(c["eaglewire_tree"]["tau"] for c in d["categories"].values())
    for f in ("bench.json", "bench.md", "bench.png"):
        assert (tmp_path / "b" / f).is_file()


def test_round_robin_spans_every_category():
    from eaglewire.decoding.run import round_robin

    cats = ["a", "a", "a", "b", "b", "c"]
    assert round_robin(3, cats) == [0, 3, 5]
    assert round_robin(4, cats) == [0, 1, 3, 5]
    assert round_robin(10, cats) == list(range(6))


def test_auto_shape_picks_the_fastest_measured_shape(tiny_targets, llama_ckpt):
    from eaglewire.decoding.bench import auto_shape
    from eaglewire.decoding.compat import load_drafter_for
    from eaglewire.decoding.engine import SpecConfig, SpecEngine

    t = tiny_targets["llama"]
    drafter, points, _ = load_drafter_for(t, llama_ckpt)
    ids = [SpecEngine(t).encode("Tell me a story.")]
    res = auto_shape(t, drafter, points, ids, 8, SpecConfig(), shapes=((2, 2, 5, 0.0), (3, 3, 8, 0.01)))
    assert len(res["shapes"]) == 2
    assert res["best"] == max(res["shapes"], key=lambda r: r["speedup_vs_plain"])
    assert all(r["tau"] is not None and r["tau"] >= 1 for r in res["shapes"])
    assert [r["min_prob"] for r in res["shapes"]] == [0.0, 0.01]


def test_generate_defaults_to_the_drafters_target_and_says_when_rounds_went_undrafted(tiny_drafter):
    """No --target: the drafter's recorded target (tiny:llama), not `default` and a fingerprint refusal."""
    from eaglewire_testing.cli import run_cli

    ckpt, _ = tiny_drafter
    r = run_cli("generate", "--drafter", ckpt, "--prompt", "Tell me about the sea.", "--max-new-tokens", 12,
                "--mode", "chain", "--min-prob", 0.999)
    assert r.returncode == 0, r.stderr
    assert "rounds had no draft above --min-prob 0.999" in r.stderr
    r = run_cli("generate", "--drafter", ckpt, "--prompt", "Tell me about the sea.", "--max-new-tokens", 12, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["generated_tokens"] > 0


def test_a_non_string_category_is_one_line(tmp_path):
    from eaglewire.decoding.run import prompt_categories
    from eaglewire.infra.errors import EaglewireError

    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a", "category": "math"}\n{"prompt": "b", "category": ["x", "y"]}\n')
    with pytest.raises(EaglewireError, match=r"p.jsonl:2: category \['x', 'y'\]: expected a string"):
        prompt_categories(p, 2)


@pytest.mark.parametrize("content", [b"garbage{", b"[1, 2]", b'{"format": "eaglewire-drafter", "version": 1, "points": 5}'])
def test_a_garbage_provenance_is_one_line(llama_ckpt, tmp_path, content):
    import shutil

    from eaglewire_testing.cli import run_cli

    bad = tmp_path / "bad"
    shutil.copytree(llama_ckpt, bad)
    (bad / "eaglewire.json").write_bytes(content)
    r = run_cli("generate", "--drafter", bad, "--target", "tiny:llama", "--prompt", "hi", "--max-new-tokens", 2)
    assert r.returncode == 2 and "eaglewire.json" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_undrafted_rounds_are_named_in_bench_md_and_generate(tiny_targets, llama_ckpt, tmp_path):
    """A threshold no draft reaches gives tau 1.00: both outputs must say why, with the counts."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hello, how are you?", "category": "chat"}\n')
    r = CliRunner().invoke(app, ["bench", "--target", "tiny:llama", "--drafter", str(llama_ckpt), "--prompts",
                                 str(prompts), "--max-new-tokens", "6", "--out", str(tmp_path / "b"), "--methods",
                                 "eaglewire_plain", "--methods", "eaglewire_tree", "--min-prob", "0.999999"])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "b" / "bench.json").read_text())["methods"]["eaglewire_tree"]
    n, gated = d["verify_steps"], d["rounds_without_drafts"]
    assert gated == n > 0  # every round verified its last token alone
    md = (tmp_path / "b" / "bench.md").read_text()
    assert f"eaglewire_tree: {n} of {n} rounds had no draft above --min-prob 0.999999" in md
    g = CliRunner().invoke(app, ["generate", "--target", "tiny:llama", "--drafter", str(llama_ckpt), "--prompt", "Hi",
                                 "--max-new-tokens", "6", "--min-prob", "0.999999"])
    assert g.exit_code == 0 and "rounds had no draft above --min-prob 0.999999" in g.stderr
