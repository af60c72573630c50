"""Prompt loading (formats, errors), de-duplication, prompt turns, length policy, self-prompts."""

import json

import pytest

from eaglewire.data.prompt_files import load_prompts
from eaglewire.data.prompts import Conversation, dedupe, prompt_turns, self_prompts
from eaglewire.infra.errors import EaglewireError


def _write(tmp_path, lines, name="p.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return p


def test_each_format(tmp_path):
    p = _write(tmp_path, [
        {"prompt": "plain prompt"},
        {"text": "text field"},
        json.dumps("bare string"),
        "",
        {"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "hi"},
                           {"from": "gpt", "value": "hello"}, {"from": "user", "value": "more"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "multi"}, {"type": "text", "text": "part"}]}]},
    ])
    convs = load_prompts(p)
    assert [c.messages for c in convs] == [
        [{"role": "user", "content": "plain prompt"}],
        [{"role": "user", "content": "text field"}],
        [{"role": "user", "content": "bare string"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        [{"role": "user", "content": "multipart"}],
    ]


@pytest.mark.parametrize("bad,msg", [
    ('{"prompt": "unterminated', "malformed JSON"),
    ({"question": "x"}, "unknown record shape"),
    (42, "unknown record shape"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, r"conversations\[0\]\.from: 'robot'"),
    ({"messages": [{"role": "user"}]}, r"messages\[0\]: expected an object with 'role' and 'content'"),
    ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\]\.content: expected a string"),
    ({"messages": [{"role": "assistant", "content": "only answer"}]}, "no non-empty user turn"),
    ({"prompt": "   "}, "no non-empty user turn"),
])
def test_bad_line_names_file_and_line(tmp_path, bad, msg):
    p = _write(tmp_path, [{"prompt": "ok"}, "", bad])
    with pytest.raises(EaglewireError, match=msg) as e:
        load_prompts(p)
    assert f"{p}:3" in str(e.value)


def test_not_utf8_names_file_line_and_byte(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(EaglewireError, match=r"latin1.jsonl:2: not UTF-8 \(byte 0xe9 at column 16\)"):
        load_prompts(p)


def test_missing_file(tmp_path):
    with pytest.raises(EaglewireError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")


def test_dedupe_normalizes_user_turns_only():
    a = Conversation([{"role": "user", "content": "Hello   World"}])
    b = Conversation([{"role": "system", "content": "x"}, {"role": "user", "content": " hello world\n"},
                      {"role": "assistant", "content": "different answer"}])
    c = Conversation([{"role": "user", "content": "Hello World!"}])
    assert a.key() == b.key() != c.key()
    kept, dropped = dedupe([a, b, c, a])
    assert kept == [a, c] and dropped == 2


def test_prompt_turns_keeps_history_up_to_last_user():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"}]
    assert prompt_turns(Conversation(msgs)) == msgs[:4]
    with pytest.raises(EaglewireError):
        prompt_turns(Conversation([{"role": "assistant", "content": "a"}]))


def test_self_prompts_unique_and_deterministic(tiny_targets):
    t = tiny_targets["qwen3"]
    convs, counts = self_prompts(t, 6, seed=3, max_new_tokens=24, batch_size=4)
    assert len(convs) == 6
    assert all(len(c.messages) == 1 and c.messages[0]["role"] == "user" for c in convs)
    assert all(c.messages[0]["content"] and c.messages[0]["content"] == c.messages[0]["content"].strip()
               for c in convs)
    assert len({c.key() for c in convs}) == 6
    assert counts.requested == 6 and counts.generated >= 6
    again, _ = self_prompts(t, 6, seed=3, max_new_tokens=24, batch_size=4)
    assert again == convs
    other, _ = self_prompts(t, 6, seed=4, max_new_tokens=24, batch_size=4)
    assert other != convs


def test_self_prompts_budget_limits_attempts(tiny_targets):
    convs, counts = self_prompts(tiny_targets["qwen3"], 5, seed=0, max_new_tokens=8, batch_size=2, max_attempts=3)
    assert counts.generated == 3 and len(convs) <= 3
