"""Composed training prompts: deterministic, diverse, and never a near-copy of the held-out benchmark set."""

from __future__ import annotations

import json
import re

from eaglewire.data.topic_prompts import TEMPLATES, topic_prompts
from eaglewire.decoding.cli import heldout_prompts_path


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
