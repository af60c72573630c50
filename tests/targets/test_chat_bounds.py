"""A chat template is code from the model's directory: rendering it is bounded in time and size (issue 58)."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets import chat
from eaglewire.targets.load import load_target, load_tokenizer

pytestmark = pytest.mark.unit

NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"
BALLOON = "{% for i in range(99999) %}{{ messages[0]['content'] * 200 }}{% endfor %}"
MSGS = [{"role": "user", "content": "Hello there"}]


def _target_with(tmp_path, template: str):
    d = shutil.copytree(load_target("tiny:llama").path, tmp_path / "t")
    (d / "chat_template.jinja").write_text(template)
    return d


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.5, raising=False)


def test_a_looping_template_is_one_line_naming_its_file(tmp_path, fast):
    d = _target_with(tmp_path, NESTED)
    tok = load_tokenizer(str(d))
    t0 = time.monotonic()
    with pytest.raises(EaglewireError, match=r"chat_template\.jinja: the chat template did not finish rendering") as e:
        chat.render(tok, MSGS, add_generation_prompt=True)
    assert time.monotonic() - t0 < 5 and "\n" not in str(e.value) and str(d) in str(e.value)


def test_a_ballooning_template_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "MAX_RENDERED_CHARS", 100_000, raising=False)
    tok = load_tokenizer(str(_target_with(tmp_path, BALLOON)))
    with pytest.raises(EaglewireError, match=r"chat_template\.jinja: the chat template rendered [\d,]+ characters"):
        chat.render(tok, MSGS, add_generation_prompt=False)


def test_generate_with_a_looping_template_stops_with_the_error(tmp_path, fast):
    from eaglewire.data.config import DataGenerateConfig
    from eaglewire.data.pipeline import run_generate

    d = _target_with(tmp_path, NESTED)
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "Hi"}) + "\n")
    with pytest.raises(EaglewireError, match="chat_template.jinja: the chat template did not finish"):
        run_generate(DataGenerateConfig(out=tmp_path / "out", target=str(d), prompts=p, max_new_tokens=2, device="cpu"))


@pytest.mark.parametrize("source", ["tiny:llama", "tiny:qwen3", "tiny:mistral", "tiny:deepseek_v3", "default"])
def test_real_templates_render_as_transformers_renders_them(source):
    tok = load_tokenizer(source)
    msgs = [*MSGS, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "More?"}]
    want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert chat.render(tok, msgs, add_generation_prompt=True) == want


def test_an_outer_alarm_keeps_running_after_a_render():
    """pytest-timeout (and anything else) may hold SIGALRM: its timer and handler come back."""
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        chat.render(load_tokenizer("tiny:llama"), MSGS, add_generation_prompt=True)
        time.sleep(0.6)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert fired == [1]
