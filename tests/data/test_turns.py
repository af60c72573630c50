"""Multi-turn builds (`data build --turns N`): each answer is the target's, asked in the conversation so far.

References: the first answers equal a one-turn build of the same prompts; the
last turn's features kept while generating equal a second forward over the
whole conversation (the dataset built without capture during generation);
the loss mask covers every answer, checked against the answers' own tokens.
"""

import json
import re

import pytest
import torch

from eaglewire.data.config import DataBuildConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.jsonl import read_jsonl
from eaglewire.data.lossmask import render_with_mask
from eaglewire.data.pipeline import run_build
from eaglewire.data.turns import FOLLOW_UPS, HELDOUT_FOLLOW_UPS, follow_up, turn_file
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.tinydata import USER_PROMPTS

NEW = 16


def _build(tmp_path, name, turns, gen_capture=True, resume=False):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in USER_PROMPTS[:6]))
    out = tmp_path / name
    run_build(DataBuildConfig(out=out, target="tiny:llama", prompts=prompts, max_new_tokens=NEW, batch_size=4,
                              store_dtype="fp32", device="cpu", gen_capture=gen_capture, turns=turns, resume=resume))
    return out


def _answers(path):
    return {r["index"]: r for r in read_jsonl(path) if "messages" in r}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("turns")
    return d, _build(d, "one", 1), _build(d, "two", 2), _build(d, "two-off", 2, gen_capture=False)


def test_each_turn_answers_the_conversation_so_far(built):
    _, one, two, _ = built
    first, last = _answers(turn_file(two, 1)), _answers(two / "responses.jsonl")
    single = _answers(one / "responses.jsonl")
    assert set(first) == set(last) == set(single) and len(last) == 6
    for i, row in last.items():
        assert first[i]["answer_ids"] == single[i]["answer_ids"]  # turn 1 is a one-turn build's answer
        u1, a1, u2, a2 = row["messages"]
        assert (u1, a1) == tuple(first[i]["messages"])
        assert u2 == {"role": "user", "content": follow_up(i, 1, 0)} and a2["role"] == "assistant"
    gen = json.loads((two / "generate.config.json").read_text())["result"]
    assert gen["settings"]["turns"] == 2 and gen["earlier_turns"][0]["responses"] == 6


def test_features_kept_while_generating_equal_a_forward_of_the_whole_conversation(built):
    _, _, two, off = built
    a, b = FeatureDataset(two), FeatureDataset(off)
    assert len(a) == len(b) == 6
    assert json.loads((two / "manifest.json").read_text())["capture"]["during_generation"] == 6
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert x["loss_mask"].tolist() == y["loss_mask"].tolist()
        torch.testing.assert_close(x["features"], y["features"], atol=1e-5, rtol=1e-4)


def test_the_loss_mask_covers_every_answer(built):
    _, one, two, _ = built
    from eaglewire.targets.load import load_tokenizer
    tok = load_tokenizer("tiny:llama")
    rows = _answers(two / "responses.jsonl")
    ds = FeatureDataset(two)
    order = [j for shard in ds.manifest.shards for j in shard["indices"]]
    for k, idx in enumerate(order):
        msgs = rows[idx]["messages"]
        first_ids, first_mask = render_with_mask(tok, msgs[:2])
        mask = ds[k]["loss_mask"].tolist()
        assert sum(mask[: len(first_ids)]) == sum(first_mask) > 0  # the first answer is trained on
        assert sum(mask[len(first_ids):]) >= len(rows[idx]["answer_ids"])  # and the last
    assert FeatureDataset(one).manifest.num_loss_tokens < ds.manifest.num_loss_tokens


def test_a_resumed_build_asks_the_same_second_turns(built):
    d, _, two, _ = built
    again = d / "again"
    again.mkdir()
    (again / "prompts.jsonl").write_bytes((two / "prompts.jsonl").read_bytes())
    rows = (turn_file(two, 1)).read_text().splitlines(keepends=True)
    turn_file(again, 1).write_text("".join(rows[:3]))  # killed after half of the first turn
    (again / "generate.config.json").write_text((two / "generate.config.json").read_text())
    _build(d, "again", 1, resume=True)  # --turns left at its default: the recorded 2 is adopted
    assert [r["messages"] for r in _answers(again / "responses.jsonl").values()] == \
        [r["messages"] for r in _answers(two / "responses.jsonl").values()]


def test_earlier_answers_are_never_overwritten_and_servers_are_refused(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    turn_file(out, 1).write_text('{"index": 0, "skipped": "empty"}\n')
    with pytest.raises(EaglewireError, match=r"responses\.turn1\.jsonl: already holds responses"):
        _build(tmp_path, "d", 2)
    with pytest.raises(EaglewireError, match="--turns 2: .*without --server"):
        run_build(DataBuildConfig(out=tmp_path / "s", target="tiny:llama", topic_prompts=2, turns=2,
                                  server="http://127.0.0.1:9/v1", device="cpu"))


def test_training_follow_ups_are_apart_from_the_heldout_ones():
    def words(s):
        return set(re.findall(r"[a-z0-9]+", s.lower()))

    assert len(set(FOLLOW_UPS)) == len(FOLLOW_UPS) >= 20
    for f in FOLLOW_UPS:
        for h in HELDOUT_FOLLOW_UPS:
            w, v = words(f), words(h)
            assert len(w & v) < 0.6 * len(w | v), (f, h)
    assert {follow_up(i, 1, 0) for i in range(200)} == set(FOLLOW_UPS)  # every entry is used
