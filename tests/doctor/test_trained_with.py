"""The seeds' case from configs alone: `doctor config --trained-with / --trained-points`, no weights.

The seeds' drafter: Kimi-K2.5 (61 layers), `eagle_config.eagle_aux_hidden_state_layer_ids: [2, 30, 58]`,
features captured through a classic SGLang (ids = outputs of layers 2, 30, 58). SGLang 0.5.23 reads the
same ids on Kimi-K2.5 one layer early (layers 1, 29, 57: tests/export/test_engine_conformance.py runs its
code), so it must be told [3, 31, 59]; a SpecForge 0.2.0 drafter (SGLang 0.5.14 captured it) with the
same ids is served right by 0.5.23 and wrong by 0.5.12. The expected values below are the seeds' own
numbers and the engines' executed rules, not eaglewire's output.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from eaglewire.doctor.verdict import UNDECIDED
from eaglewire_testing.cli import run_cli

pytestmark = pytest.mark.unit

SEEDS = ["layers.2.out", "layers.30.out", "layers.58.out"]  # what the seeds' extraction captured
EARLY = ["layers.1.out", "layers.29.out", "layers.57.out"]  # what SGLang >= 0.5.13 reads [2, 30, 58] as on Kimi
KIMI = ["--arch", "kimi_k25", "--target-layers", "61"]


@pytest.fixture
def drafter(tmp_path):
    """A drafter directory in the layout published for Kimi-K2.5 drafters: config.json alone."""
    d = tmp_path / "kimi-drafter"
    d.mkdir()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
           "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840, "draft_vocab_size": 32000,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _doctor(d, engine, *args):
    r = run_cli("doctor", "config", d, "--engine", engine, *KIMI, *args, "--json")
    assert r.returncode in (0, 1, UNDECIDED), r.stderr
    rep = json.loads(r.stdout)
    return r.returncode, rep, {c["name"]: c for c in rep["checks"]}


def test_nothing_known_is_not_ok_and_names_each_reading(drafter):
    """Today: WARN 'training points unknown', then verdict OK. Now: one ASK row per reading, exit 3."""
    code, rep, _ = _doctor(drafter, "sglang==0.5.23")
    assert code == UNDECIDED == 3 and rep["verdict"] == "unknown" and rep["ok"] is False
    asks = [c["detail"] for c in rep["checks"] if c["level"] == "question"]
    classic = next(a for a in asks if "SGLang < 0.5.13" in a)
    assert str(SEEDS) in classic and "[3, 31, 59]" in classic
    specforge = next(a for a in asks if "specforge 0.2.0 (SGLang 0.5.14)" in a)
    assert str(EARLY) in specforge and specforge.endswith("feeds the same")
    assert {tuple(r["trained"]) for r in rep["readings"]} == {tuple(SEEDS), tuple(EARLY)}
    table = run_cli("doctor", "config", drafter, "--engine", "sglang==0.5.23", *KIMI)
    assert table.returncode == 3 and "verdict: UNKNOWN (exit 3): " in table.stdout and "--trained-with" in table.stdout
    assert "verdict: OK" not in table.stdout and "  ASK   if trained by" in table.stdout


@pytest.mark.parametrize("engine, ok, fix", [("sglang==0.5.23", False, [3, 31, 59]), ("sglang==0.5.12", True, None)])
def test_trained_through_classic_sglang(drafter, engine, ok, fix):
    for how in (["--trained-with", "sglang==0.5.12"], ["--trained-points", ",".join(SEEDS)],
                ["--trained-points", SEEDS[0], "--trained-points", "layers.30.out,layers.58.out"]):
        code, rep, c = _doctor(drafter, engine, *how)
        assert c["points"]["ok"] is ok and code == (0 if ok else 1) and rep["trained"] == SEEDS, how
        if fix:
            assert c["points"]["fix"].startswith(f'set "eagle_aux_hidden_state_layer_ids": {fix} inside eagle_config')


@pytest.mark.parametrize("engine, ok, fix", [("sglang==0.5.23", True, None), ("sglang==0.5.12", False, [1, 29, 57])])
def test_trained_by_specforge_0_2_0_through_its_sglang_0_5_14(drafter, engine, ok, fix):
    code, rep, c = _doctor(drafter, engine, "--trained-with", "specforge==0.2.0")
    assert rep["trained"] == EARLY and "SGLang 0.5.14" in c["training"]["detail"]
    assert c["points"]["ok"] is ok and code == (0 if ok else 1)
    if fix:
        assert c["points"]["fix"].startswith(f'set "eagle_aux_hidden_state_layer_ids": {fix} inside eagle_config')


def test_specforge_0_1_0_trained_on_fixed_layers_whatever_the_ids(drafter):
    """0.1.0 captured HF [2, L//2, L-3] = outputs of layers 1, 29, 57 and never read the config's ids."""
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [3, 31, 59]
    (drafter / "config.json").write_text(json.dumps(cfg))
    code, rep, c = _doctor(drafter, "sglang==0.5.23", "--trained-with", "specforge==0.1.0")
    assert rep["trained"] == EARLY and code == 1 and "ids not read" in c["training"]["detail"]
    assert c["points"]["fix"].startswith('set "eagle_aux_hidden_state_layer_ids": [1, 29, 57]')


def test_a_producer_without_version_asks_for_it_only_where_versions_differ(drafter):
    r = run_cli("doctor", "config", drafter, "--engine", "sglang==0.5.23", *KIMI, "--trained-with", "sglang")
    verdict = r.stdout.splitlines()[-1]
    assert r.returncode == 3 and verdict.startswith("verdict: UNKNOWN") and "--trained-with sglang==0.5.12" in verdict
    code, rep, c = _doctor(drafter, "sglang==0.5.23", "--trained-with", "specforge")  # both releases: layers 1/29/57
    assert code == 0 and rep["trained"] == EARLY and "every reading agrees" in c["training"]["detail"]


def test_on_a_llama_target_every_sglang_version_agrees(drafter):
    r = run_cli("doctor", "config", drafter, "--engine", "sglang==0.5.23", "--arch", "LlamaForCausalLM",
                "--target-layers", "61", "--json")
    rep = json.loads(r.stdout)
    groups = {tuple(g["trained"]): g["producers"] for g in rep["readings"]}
    assert r.returncode == 3 and "SGLang capture" in groups[tuple(SEEDS)]  # classic on Llama, at any version


def test_config_only_says_the_tensors_were_not_checked(drafter):
    _, _, c = _doctor(drafter, "sglang==0.5.23", "--trained-with", "specforge==0.2.0")
    assert c["weights"]["level"] == "warning" and "checks were skipped" in c["weights"]["detail"]


@pytest.mark.parametrize("args, msg", [
    (["--trained-with", "specforge==0.1.5"], "known: 0.1.0, 0.2.0"),
    (["--trained-with", "specforg==0.2.0"], "expected one of specforge"),
    (["--trained-with", "specforge==0.2.0", "--trained-points", "layers.2.out"], "both given"),
    (["--trained-with", "eaglewire"], "--trained-on RUN"),
    (["--trained-points", "layers.61.out"], "the target has 61 layers"),
    (["--trained-with", "sglang==0.5.12", "--trained-on", "somewhere"], "both given"),
])
def test_bad_training_claims_are_one_line(drafter, args, msg):
    r = run_cli("doctor", "config", drafter, "--engine", "sglang==0.5.23", *KIMI, *args)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _readme_block() -> list[tuple[list[str], list[str]]]:
    """(command args, the output lines shown under it) of the README's wiring-check block."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    m = re.search(r"<!-- wiring-check -->\n```console\n(.*?)```\n<!-- /wiring-check -->", text, re.S)
    assert m, "README.md: the wiring-check block (<!-- wiring-check -->) is missing"
    out: list[tuple[list[str], list[str]]] = []
    for line in m.group(1).splitlines():
        if line.startswith("$ eaglewire "):
            out.append((shlex.split(line)[2:], []))
        else:
            out[-1][1].append(line.strip())
    return out


def _shown_in(shown: str, printed: list[str]) -> bool:
    """A shown line is printed as is, or with '...' standing for what the README leaves out."""
    pat = ".*?".join(re.escape(part) for part in shown.split("..."))
    return any(re.fullmatch(pat, p.strip()) for p in printed)


def test_the_readme_wiring_section_prints_what_it_shows(drafter, monkeypatch):
    monkeypatch.chdir(drafter.parent)
    block = _readme_block()
    assert len(block) == 3 and all(args[:2] == ["doctor", "config"] for args, _ in block)
    for args, shown in block:
        r = run_cli(*args)
        printed = r.stdout.splitlines()
        assert r.returncode == {"UNKNOWN": 3, "problems": 1, "OK": 0}[shown[-1].split()[1]], r.stdout + r.stderr
        missing = [s for s in shown if not _shown_in(s, printed)]
        assert not missing, f"README shows lines `{' '.join(args)}` does not print: {missing}\n{r.stdout}"


def test_the_readme_check_sees_a_stale_line():
    assert _shown_in("fix: set ... [3, 31, 59] inside eagle_config ...", ['  fix: set "x": [3, 31, 59] inside eagle_config (y)'])
    assert not _shown_in("fix: set ... [2, 30, 58] inside eagle_config ...", ['fix: set "x": [3, 31, 59] inside eagle_config'])


def test_no_ids_every_reading_agrees_on_the_default(drafter):
    """Without ids every producer captures the EAGLE-3 default (SpecForge's [1, L//2-1, L-4] reads the same):
    nothing to ask, and SGLang's default feeds it."""
    cfg = json.loads((drafter / "config.json").read_text())
    del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (drafter / "config.json").write_text(json.dumps(cfg))
    code, rep, c = _doctor(drafter, "sglang==0.5.23")
    assert code == 0 and rep["trained"] == EARLY and "every reading agrees" in c["training"]["detail"]
    assert c["points"]["ok"] and not any(x["level"] == "question" for x in rep["checks"])
