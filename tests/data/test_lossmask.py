"""Loss masks from chat templates: exactly the assistant contents plus the end-of-turn token."""

import pytest

from conftest import ARCHS
from eaglewire.data import lossmask
from eaglewire.data.lossmask import render_with_mask
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import render

# Written out by hand (not derived from the code under test).
END_OF_TURN = {
    "llama": "<|eot_id|>",
    "qwen3": "<|im_end|>",
    "mistral": "</s>",
    "deepseek_v3": "<｜end▁of▁sentence｜>",
    "default": "<|im_end|>",
}
SYSTEM = "Sysword rules apply."
USERS = ["Userone asks something?", "Usertwo wants more.\n", "  Userthree: last one"]
ANSWERS = ["Hello there, I am fine.", " Sure, here is a plan:\n1. pack", "def add(a, b): return a + b"]


def _conv(turns: int, system: bool) -> list[dict]:
    msgs = [{"role": "system", "content": SYSTEM}] if system else []
    for u, a in zip(USERS[:turns], ANSWERS[:turns], strict=True):
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return msgs


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """Contiguous [start, end) runs of ones."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _check(tok, arch: str, turns: int, system: bool) -> None:
    msgs = _conv(turns, system)
    ids, mask = render_with_mask(tok, msgs)
    assert len(ids) == len(mask) and set(mask) <= {0, 1}

    def dec(x):
        return tok.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    assert dec(ids) == render(tok, msgs, add_generation_prompt=False)
    runs = _runs(mask)
    assert len(runs) == turns
    for (lo, hi), answer in zip(runs, ANSWERS[:turns], strict=True):
        assert dec(ids[lo:hi]) == answer + END_OF_TURN[arch]
    masked = dec([i for i, m in zip(ids, mask, strict=True) if m])
    unmasked = dec([i for i, m in zip(ids, mask, strict=True) if not m])
    for text in ([SYSTEM] if system else []) + USERS[:turns]:
        assert text.strip() not in masked
        # the tiny mistral template (like Mistral's older ones) silently drops system messages
        assert (text.strip() in unmasked) == (text.strip() in render(tok, msgs, False))
    assert all(u.strip() in unmasked for u in USERS[:turns])
    for word in ("user", "assistant", "system", "User", "Assistant", "[INST]"):
        assert word not in masked  # no role headers / generation prompt leaked into the mask


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("system", [False, True])
def test_tiny_templates(tiny_targets, arch, turns, system):
    _check(tiny_targets[arch].tokenizer, arch, turns, system)


@pytest.mark.slow
@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("system", [False, True])
def test_default_target(default_target, turns, system):
    _check(default_target.tokenizer, "default", turns, system)


def test_chatml_newline_after_im_end_is_not_masked(tiny_targets):
    tok = tiny_targets["qwen3"].tokenizer
    ids, mask = render_with_mask(tok, _conv(1, False))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    last = max(i for i, m in enumerate(mask) if m)
    assert ids[last] == end and ids[last + 1:] and not any(mask[last + 1:])


@pytest.mark.parametrize("arch", ARCHS)
def test_offset_fallback_matches_token_path(tiny_targets, arch, monkeypatch):
    tok = tiny_targets[arch].tokenizer
    msgs = _conv(3, True)
    expected = render_with_mask(tok, msgs)
    monkeypatch.setattr(lossmask, "_token_spans", lambda *a, **k: None)
    assert render_with_mask(tok, msgs) == expected


def test_template_that_rewrites_history_is_rejected(tiny_targets):
    tok = tiny_targets["qwen3"].tokenizer
    saved = tok.chat_template
    # marks the final message differently, like templates that strip reasoning from old turns
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if loop.last %}LAST {% endif %}"
                         "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    try:
        with pytest.raises(EaglewireError, match="assistant turn 1 renders differently"):
            render_with_mask(tok, _conv(2, False))
    finally:
        tok.chat_template = saved


def test_no_assistant_turn_gives_empty_mask(tiny_targets):
    ids, mask = render_with_mask(tiny_targets["llama"].tokenizer, [{"role": "user", "content": "Hi"}])
    assert ids and not any(mask)


@pytest.mark.slow
def test_default_boundary_merge_uses_offsets(default_target):
    """SmolLM's BPE merges the header's "\\n" with a leading space of the answer ("\\n " token), so
    token prefixes differ; the offset fallback leaves that straddling token unmasked (it starts
    in the prompt) and masks the rest."""
    tok = default_target.tokenizer
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  two spaces"}]
    full = render(tok, msgs, False)
    texts = lossmask._turn_texts(tok, msgs, full)
    assert lossmask._token_spans(tok, texts, lossmask.encode(tok, full)) is None
    ids, mask = render_with_mask(tok, msgs)
    masked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m], clean_up_tokenization_spaces=False)
    assert masked == " two spaces<|im_end|>"
