"""Composed training prompts: deterministic, diverse, and never a near-copy of the held-out benchmark set."""

from __future__ import annotations

import json
import re

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.prompts import Conversation, drop_heldout
from eaglewire.data.topic_prompts import TEMPLATES, topic_prompts


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", s.lower()))


def _heldout() -> list[dict]:
    return [json.loads(x) for x in heldout_prompts_path().read_text().splitlines() if x.strip()]


def test_deterministic_unique_and_all_task_types():
    a, b = topic_prompts(400, seed=3), topic_prompts(400, seed=3)
    assert [c.messages for c in a] == [c.messages for c in b]
    texts = [c.messages[0]["content"] for c in a]
    assert len(set(texts)) == 400
    assert topic_prompts(50, seed=4)[0].messages != a[0].messages
    # every task type appears (round-robin), checked by each template family's fixed words
    for kind, tpls in TEMPLATES.items():
        stems = [re.split(r"\{", t)[0].strip() for t in tpls]
        assert any(any(x.startswith(s) for s in stems if s) or not any(stems) for x in texts), kind


def test_the_heldout_set_is_shipped_and_broad():
    rows = _heldout()
    assert len(rows) >= 40 and len({r["category"] for r in rows}) >= 8
    assert len({r["prompt"] for r in rows}) == len(rows)


def test_no_training_prompt_is_a_near_copy_of_a_heldout_prompt():
    held = [_words(r["prompt"]) for r in _heldout()]
    for c in topic_prompts(3000, seed=0):
        w = _words(c.messages[0]["content"])
        for h in held:
            jacc = len(w & h) / len(w | h)
            assert jacc < 0.6, (c.messages[0]["content"], h)


def _jaccard(a: str, b: str) -> float:
    wa, wb = _words(a), _words(b)
    return len(wa & wb) / len(wa | wb)


def test_drop_heldout_agrees_with_a_naive_jaccard():
    held = [r["prompt"] for r in _heldout()]
    texts = [held[0] + " Please.", held[7].upper(), "Explain how tides work, in two sentences.",
             " ".join(held[3].split()[:4]), held[12].replace(".", "?")]
    convs = [Conversation([{"role": "user", "content": t}]) for t in texts]
    kept, dropped = drop_heldout(convs, held)
    expect = [c for c, t in zip(convs, texts) if max(_jaccard(t, h) for h in held) < 0.6]
    assert kept == expect
    assert dropped == 3 and len(kept) == 2  # the two near-copies and the changed punctuation; a stub and a new prompt stay


def test_generated_prompts_never_restate_a_heldout_prompt_but_a_users_file_is_kept(tmp_path, monkeypatch):
    import eaglewire.data.pipeline as pipeline
    from eaglewire.data.config import DataGenerateConfig
    from eaglewire.data.jsonl import read_jsonl
    from eaglewire.data.pipeline import _collect_prompts

    held = _heldout()[5]["prompt"]
    fresh = Conversation([{"role": "user", "content": "List three uses of a paperclip."}])
    monkeypatch.setattr(pipeline, "topic_prompts", lambda n, seed: [Conversation([{"role": "user", "content": held}]), fresh])
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": _heldout()[9]["prompt"]}) + "\n")
    cfg = DataGenerateConfig(out=tmp_path / "d", prompts=mine, topic_prompts=2)
    (tmp_path / "d").mkdir()
    convs, counts = _collect_prompts(cfg, target=None)
    assert [c.messages[0]["content"] for c in convs] == [_heldout()[9]["prompt"], fresh.messages[0]["content"]]
    assert counts["heldout_near_copies"] == 1 and counts["unique"] == 2
    assert [r["messages"][0]["content"] for r in read_jsonl(tmp_path / "d" / "prompts.jsonl")] == [
        c.messages[0]["content"] for c in convs]
