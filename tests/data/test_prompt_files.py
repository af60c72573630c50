"""--prompts from the files users have: ShareGPT JSON arrays, parquet (HF datasets), directories, globs, cached hub datasets."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eaglewire.data.prompt_files import load_prompts
from eaglewire.data.prompts import prompt_turns
from eaglewire.infra.errors import EaglewireError
from eaglewire_testing.hubcache import cache_repo

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Q1"},
                                  {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"},
                                  {"from": "gpt", "value": "A2"}]},
]
# the same conversations written by hand in role/content form
AS_MESSAGES = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
]


def _parquet(path, rows, schema=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _ultrachat_rows(tag):
    """Rows shaped like HuggingFaceH4/ultrachat_200k's train_sft files: prompt, prompt_id, messages."""
    return [{"prompt": f"{tag} q{i}", "prompt_id": f"{tag}{i}",
             "messages": [{"role": "user", "content": f"{tag} q{i}"}, {"role": "assistant", "content": f"a{i}"},
                          {"role": "user", "content": f"{tag} follow-up {i}"}]} for i in range(2)]


def _msgs(convs):
    return [c.messages for c in convs]


def test_sharegpt_json_array_reads_like_the_same_records_as_jsonl(tmp_path):
    arr = tmp_path / "sharegpt.json"
    arr.write_text(json.dumps(SHAREGPT, indent=2))
    lines = tmp_path / "sharegpt.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))
    assert _msgs(load_prompts(arr)) == AS_MESSAGES == _msgs(load_prompts(lines))


def test_multi_turn_sharegpt_regenerates_only_the_final_answer(tmp_path):
    """As for multi-turn JSONL: earlier turns are kept as written, the prompt ends at the last user turn."""
    arr = tmp_path / "sharegpt.json"
    arr.write_text(json.dumps(SHAREGPT))
    conv = load_prompts(arr)[1]
    assert prompt_turns(conv) == AS_MESSAGES[1][:4]


def test_parquet_messages_and_prompt_columns(tmp_path):
    uc = _parquet(tmp_path / "data" / "train_sft-00000-of-00001.parquet", _ultrachat_rows("u"))
    assert _msgs(load_prompts(uc)) == [r["messages"] for r in _ultrachat_rows("u")]  # messages win over prompt
    only = _parquet(tmp_path / "prompts.parquet", [{"prompt": "p0", "id": 1}, {"prompt": "p1", "id": 2}])
    assert _msgs(load_prompts(only)) == [[{"role": "user", "content": "p0"}], [{"role": "user", "content": "p1"}]]
    holes = _parquet(tmp_path / "holes.parquet", [{"prompt": "p0", "messages": None},
                                                  {"prompt": "p1", "messages": [{"role": "user", "content": "m1"}]}])
    assert _msgs(load_prompts(holes)) == [[{"role": "user", "content": "p0"}], [{"role": "user", "content": "m1"}]]


def _snapshot(root):
    """A dataset directory as `hf download --repo-type dataset` leaves one (plus files that are not rows)."""
    _parquet(root / "data" / "train_sft-00001-of-00002.parquet", _ultrachat_rows("t1"))
    _parquet(root / "data" / "train_sft-00000-of-00002.parquet", _ultrachat_rows("t0"))
    _parquet(root / "data" / "test_sft-00000-of-00001.parquet", _ultrachat_rows("e"))
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    (root / "dataset_info.json").write_text('{"features": {}}')
    (root / ".cache").mkdir()
    (root / ".cache" / "x.jsonl").write_text('{"prompt": "hidden"}\n')
    (root / "extra.jsonl").write_text('{"prompt": "extra"}\n')
    return root


def _users(convs):
    return [c.messages[0]["content"] for c in convs]


def test_a_directory_reads_its_prompt_files_in_sorted_order(tmp_path):
    d = _snapshot(tmp_path / "snap")
    assert _users(load_prompts(d)) == ["e q0", "e q1", "t0 q0", "t0 q1", "t1 q0", "t1 q1", "extra"]
    assert _users(load_prompts(d / "data" / "train_sft-*.parquet")) == ["t0 q0", "t0 q1", "t1 q0", "t1 q1"]


def test_a_dataset_in_the_local_hub_cache(tmp_path, monkeypatch):
    src = _snapshot(tmp_path / "src")
    cache_repo(tmp_path / "hub", "acme/chats", src, repo_type="dataset")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert _users(load_prompts("acme/chats")) == _users(load_prompts(src))
    assert _users(load_prompts("acme/chats/data/train_sft-*.parquet")) == ["t0 q0", "t0 q1", "t1 q0", "t1 q1"]
    with pytest.raises(EaglewireError) as e:
        load_prompts("acme/absent")
    msg = str(e.value)
    assert "\n" not in msg and f"not in the local Hugging Face cache at {tmp_path / 'hub'}" in msg
    assert "`hf download acme/absent --repo-type dataset`" in msg


def _raises(path, expected: str):
    with pytest.raises(EaglewireError, match=re.escape(expected)) as e:
        load_prompts(path)
    assert "\n" not in str(e.value)


def test_malformed_sharegpt_json_names_file_and_line_or_row(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[\n {"conversations": [{"from": "human", "value": "hi"}]},\n {"conversations": oops}\n]')
    _raises(p, f"{p}:3: malformed JSON (Expecting value at column 20)")
    bad_role = [SHAREGPT[0], {"id": "x", "conversations": [{"from": "robot", "value": "beep"}]}]
    p.write_text(json.dumps(bad_role))
    _raises(p, f"{p}[1]: conversations[0].from: 'robot' is not one of")
    p.write_text(json.dumps([SHAREGPT[0], {"id": "y", "conversations": [{"from": "human"}]}]))
    _raises(p, f"{p}[1]: conversations[0]: expected an object with 'from' and 'value'")
    p.write_bytes(b'[\n{"prompt": "ok"},\n{"prompt": "caf\xe9"}]')
    _raises(p, f"{p}:3: not UTF-8 (byte 0xe9 at column 16)")


def test_malformed_parquet_names_file_row_and_column(tmp_path):
    rows = _ultrachat_rows("u")
    rows[1]["messages"][0]["role"] = "robot"
    p = _parquet(tmp_path / "bad_role.parquet", rows)
    _raises(p, f"{p}[1]: messages[0].role: 'robot' is not one of")
    p = _parquet(tmp_path / "no_user.parquet", [{"prompt": "ok"}, {"prompt": "  "}])
    _raises(p, f"{p}[1]: no non-empty user turn")
    p = _parquet(tmp_path / "cols.parquet", [{"question": "q", "answer": "a"}])
    _raises(p, f"{p}: no messages, conversations, prompt, text column (columns: question, answer)")
    p = tmp_path / "corrupt.parquet"
    p.write_bytes(b"PAR1 this is not parquet")
    _raises(p, f"{p}: not a readable parquet file")


def test_missing_sources_say_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    _raises(tmp_path / "promts.jsonl",
            f"prompt file {tmp_path / 'promts.jsonl'} does not exist (did you mean {tmp_path / 'prompts.jsonl'}?)")
    (tmp_path / "empty").mkdir()
    _raises(tmp_path / "empty", f"{tmp_path / 'empty'}: no .jsonl, .json, .parquet files")


def test_a_typo_under_a_local_directory_is_not_taken_for_a_hub_dataset(tmp_path, monkeypatch):
    """`runs/x/promts.jsonl` spells a hub id `runs/x`; the directory exists here, so it is a local typo."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    _raises("runs/x/promts.jsonl", "prompt file runs/x/promts.jsonl does not exist (did you mean runs/x/prompts.jsonl?)")


def test_a_json_file_with_one_pretty_printed_record(tmp_path):
    (tmp_path / "one.json").write_text(json.dumps({"prompt": "hi there"}, indent=2))
    assert _msgs(load_prompts(tmp_path / "one.json")) == [[{"role": "user", "content": "hi there"}]]
    (tmp_path / "two.json").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')  # JSONL under a .json name
    assert _msgs(load_prompts(tmp_path / "two.json")) == [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
