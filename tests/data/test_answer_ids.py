"""Stored answers are the target's token ids: a sample trains on exactly what the target generated.

The reference is transformers' own greedy `generate` on the same tiny target;
answers are cut by --max-new-tokens, so some end inside a multi-byte
character, which decoding and re-tokenising would not give back.
"""

import json

import pytest
import torch

from eaglewire.data.config import DataExtractConfig, DataGenerateConfig
from eaglewire.data.dataset import FeatureDataset
from eaglewire.data.lossmask import render_with_mask
from eaglewire.data.pipeline import info, run_extract, run_generate
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import encode
from eaglewire_testing.tinydata import USER_PROMPTS

NEW = 9  # short: most answers are cut mid-way


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("answers")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in USER_PROMPTS))
    out = root / "ds"
    run_generate(DataGenerateConfig(out=out, target="tiny:llama", prompts=prompts, max_new_tokens=NEW,
                                    batch_size=1, device="cpu"))
    rows = [json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()]
    return out, [r for r in rows if "messages" in r]


@torch.no_grad()
def _reference(t, messages) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy answer ids up to and including eos) from transformers' generate."""
    prompt = t.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    out = t.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                           eos_token_id=t.eos_ids(), pad_token_id=t.tokenizer.pad_token_id)[0, len(prompt):].tolist()
    eos = set(t.eos_ids())
    cut = next((k + 1 for k, x in enumerate(out) if x in eos), len(out))
    return prompt, out[:cut]


def test_samples_hold_the_ids_the_target_generated(generated, tiny_targets):
    out, rows = generated
    t = tiny_targets["llama"]
    run_extract(DataExtractConfig(data=out, target="tiny:llama", store_dtype="fp32", device="cpu", shard_samples=8))
    man = json.loads((out / "manifest.json").read_text())
    order = [i for s in man["shards"] for i in s["indices"]]
    ds = FeatureDataset(out)
    changed = 0
    for r in rows:
        prompt, ref = _reference(t, r["messages"][:-1])
        assert r["answer_ids"] == ref  # what generate stored
        item = ds[order.index(r["index"])]
        ids, mask = item["input_ids"].tolist(), item["loss_mask"].int().tolist()
        assert ids[: len(prompt)] == prompt and ids[len(prompt): len(prompt) + len(ref)] == ref
        assert mask[: len(prompt)] == [0] * len(prompt) and mask[len(prompt): len(prompt) + len(ref)] == [1] * len(ref)
        text_ids = render_with_mask(t.tokenizer, r["messages"])[0]
        changed += text_ids[len(prompt): len(prompt) + len(ref)] != ref
    assert changed, "no answer re-tokenises differently: the test would not tell ids from text"
    assert man["answer_tokens"] == {"target_ids": len(rows), "retokenized_text": 0}
    assert info(out)["answer_tokens"]["target_ids"] == len(rows)


def test_a_finished_answer_ends_like_the_text_path(tiny_targets):
    """An answer the target ended itself: the ids path gives what rendering the whole conversation gives."""
    from eaglewire.data.answers import sample_ids

    t = tiny_targets["qwen3"]  # ChatML: "<|im_end|>\n" after the answer, the "\n" never generated (mask 0)
    msgs = [{"role": "user", "content": "Tell me about the sea."}, {"role": "assistant", "content": "The sea is blue."}]
    ref_ids, ref_mask = render_with_mask(t.tokenizer, msgs)
    answer = encode(t.tokenizer, "The sea is blue.") + [t.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert sample_ids(t.tokenizer, {"messages": msgs, "answer_ids": answer}) == (ref_ids, ref_mask)
    cut = sample_ids(t.tokenizer, {"messages": msgs, "answer_ids": answer[:-1]})  # cut: the template closes it
    assert cut == (ref_ids, ref_mask)


def test_old_rows_without_ids_still_extract(generated, tiny_targets, tmp_path):
    src, rows = generated
    d = tmp_path / "old"
    d.mkdir()
    (d / "responses.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "answer_ids"}) + "\n"
                                               for r in rows))
    run_extract(DataExtractConfig(data=d, target="tiny:llama", store_dtype="fp32", device="cpu", shard_samples=8))
    man = json.loads((d / "manifest.json").read_text())
    order = [i for s in man["shards"] for i in s["indices"]]
    ds = FeatureDataset(d)
    for r in rows:
        ids, mask = render_with_mask(tiny_targets["llama"].tokenizer, r["messages"])
        item = ds[order.index(r["index"])]
        assert item["input_ids"].tolist() == ids and item["loss_mask"].int().tolist() == mask
    assert man["answer_tokens"] == {"target_ids": 0, "retokenized_text": len(rows)}


@pytest.mark.parametrize("ids, why", [([3, "x"], "answer_ids[1] is 'x'"), ([], "non-empty list"),
                                      ([True], "answer_ids[0] is True"), (7, "answer_ids is 7"),
                                      ([5, 10 ** 9], "answer_ids[1] is 1000000000: expected a token id from 0 to")])
def test_a_bad_answer_ids_field_is_one_line_naming_the_line(generated, tmp_path, ids, why):
    _, rows = generated
    d = tmp_path / "bad"
    d.mkdir()
    bad = [dict(r) for r in rows[:3]]
    bad[1]["answer_ids"] = ids
    (d / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(EaglewireError) as e:
        run_extract(DataExtractConfig(data=d, target="tiny:llama", device="cpu"))
    msg = str(e.value)
    assert "\n" not in msg and f"{d / 'responses.jsonl'}:2: " in msg and why in msg, msg
    assert not (d / "manifest.json").exists()


def test_online_training_reads_the_same_ids_and_checks_them(generated, tiny_targets, tmp_path):
    from eaglewire.data.extract import tokenize_rows
    from eaglewire.training.config import TrainConfig
    from eaglewire.training.loop import run_train
    from eaglewire.training.online_features import OnlineDataset

    _, rows = generated
    ds = OnlineDataset(tmp_path, rows, tiny_targets["llama"], ["layers.1.out"], "fp32")
    assert ds.items == tokenize_rows(tiny_targets["llama"].tokenizer, rows, 2048)[0]  # extraction's samples
    assert ds.manifest.answer_tokens == {"target_ids": len(rows), "retokenized_text": 0}
    d = tmp_path / "online"
    d.mkdir()
    bad = [dict(r) for r in rows[:3]]
    bad[2]["answer_ids"] = [1, 10 ** 9]
    (d / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(EaglewireError, match=r"responses\.jsonl:3: answer_ids\[1\] is 1000000000"):
        run_train(TrainConfig(data=d, out=tmp_path / "run", online=True, target="tiny:llama", device="cpu", max_steps=1))
