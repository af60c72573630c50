"""A failed `data build` leaves no lock file, and no directory it made and left empty; answers stay, resumable."""

import json

import pytest

from eaglewire.data.config import DataBuildConfig
from eaglewire.data.pipeline import run_build
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.locks import LOCK_NAME

PROMPTS = [f"Tell me about the sea ({i})." for i in range(4)]


def _build(out, prompts, **kw):
    return run_build(DataBuildConfig(out=out, target=kw.pop("target", "tiny:llama"), prompts=prompts, device="cpu",
                                     max_new_tokens=6, batch_size=2, vocab_size=50, **kw))


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt": x}) + "\n" for x in PROMPTS))
    return p


@pytest.fixture
def fail_on_batch(monkeypatch):
    """Make generation raise on its n-th batch (1-based), as an OOM or a killed device would."""
    import eaglewire.data.generate as gen

    real, calls = gen.generate_batch, []

    def arm(n):
        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == n:
                raise RuntimeError("device lost")
            return real(*a, **k)
        monkeypatch.setattr(gen, "generate_batch", flaky)
    return arm


def test_bad_prompts_or_target_leave_nothing(tmp_path, prompts, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": oops}\n')
    with pytest.raises(EaglewireError, match=f"{bad}:1: malformed JSON"):
        _build(tmp_path / "new" / "ds", bad)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(EaglewireError, match="not in the local Hugging Face cache"):
        _build(tmp_path / "new" / "ds", prompts, target="acme/absent")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "p.jsonl"]


def test_an_existing_directory_is_kept_and_only_the_lock_goes(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("user data")
    with pytest.raises(EaglewireError):
        _build(out, tmp_path / "missing.jsonl")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_failure_before_the_first_answer_needs_no_resume(tmp_path, prompts, fail_on_batch):
    out = tmp_path / "ds"
    fail_on_batch(1)
    with pytest.raises(RuntimeError, match="device lost"):
        _build(out, prompts)
    assert not (out / LOCK_NAME).exists() and (out / "responses.jsonl").read_text() == ""
    fail_on_batch(10**6)
    assert _build(out, prompts)["generate"]["responses"] == len(PROMPTS)  # no --resume needed: nothing was lost


def test_answers_written_before_a_failure_are_kept_and_resumed(tmp_path, prompts, fail_on_batch):
    out = tmp_path / "ds"
    fail_on_batch(2)
    with pytest.raises(RuntimeError, match="device lost"):
        _build(out, prompts)
    first = (out / "responses.jsonl").read_text()
    assert len(first.splitlines()) == 2 and not (out / LOCK_NAME).exists()
    with pytest.raises(EaglewireError, match="already holds responses; pass --resume"):
        _build(out, prompts)
    assert (out / "responses.jsonl").read_text() == first
    fail_on_batch(10**6)
    res = _build(out, prompts, resume=True)
    assert res["generate"]["resumed"] == 2 and res["generate"]["responses"] == 2
    done = (out / "responses.jsonl").read_text()
    assert done.startswith(first) and len(done.splitlines()) == 4 and (out / "manifest.json").is_file()
