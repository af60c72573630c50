"""Loss masks derived from the chat template itself.

The drafter must learn to predict exactly the tokens the target generates:
the assistant contents and the end-of-turn token the target emits to stop.
Hard-coding markers such as ``<|im_start|>assistant`` breaks on every new
template family, so the assistant span of turn *i* is found by rendering
``messages[:i]`` with the generation prompt and ``messages[:i+1]`` without
it: the difference is what the target produces for that turn.

Trailing-token rule: inside that difference, tokens are masked up to and
including the FIRST end-of-turn token (the tokenizer's eos plus the token the
template closes an assistant turn with, see :func:`assistant_end_ids`).
Anything the template appends after it (ChatML's ``"\\n"`` after
``<|im_end|>``) is masked 0: at inference the target stops at the
end-of-turn token, so those tokens are never generated and never drafted.
If the difference contains no end-of-turn token at all (a template without
one), the whole difference is masked.

Spans come from token-prefix checks when tokenization is prefix-stable;
otherwise (BPE merging across the header/answer boundary, e.g. SmolLM's
``"\n "`` token when an answer starts with spaces) from character offsets,
where a token belongs to the turn iff it STARTS inside it.
"""

from __future__ import annotations

from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import assistant_end_ids, encode, render


def _is_prefix(a: list[int], b: list[int]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def _token_spans(tokenizer, texts: list[tuple[str, str]], full_ids: list[int]):
    """Assistant token spans via token-prefix checks, or None if not prefix-stable."""
    spans = []
    for before, upto in texts:
        a, b = encode(tokenizer, before), encode(tokenizer, upto)
        if not (_is_prefix(a, b) and _is_prefix(b, full_ids)):
            return None
        spans.append((len(a), len(b)))
    return spans


def _offset_spans(tokenizer, texts: list[tuple[str, str]], full: str):
    """Assistant token spans from character offsets: a token belongs to the turn if it starts inside it.

    Used when tokenization merges across the prompt/answer boundary. A token
    straddling the start belongs to the prompt (it starts there).
    """
    try:
        enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError) as e:
        raise EaglewireError(
            "loss mask: tokenization is not prefix-stable for this template and the tokenizer gives no "
            f"character offsets ({e}); expected a fast tokenizer"
        ) from e
    starts = [s for s, _ in enc["offset_mapping"]]
    spans = []
    for before, upto in texts:
        lo, hi = len(before), len(upto)
        idx = [k for k, s in enumerate(starts) if lo <= s < hi]
        spans.append((idx[0], idx[-1] + 1) if idx else (0, 0))
    return spans


def _turn_texts(tokenizer, messages: list[dict], full: str) -> list[tuple[str, str]]:
    """(prompt-with-generation-header, prompt+answer) strings for every assistant turn."""
    out = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        upto = render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not upto.startswith(before) or not full.startswith(upto):
            raise EaglewireError(
                f"loss mask: assistant turn {i} renders differently in context (the template is not "
                "append-only, e.g. it rewrites earlier turns); expected render(messages[:i]) + generation "
                "prompt to be a prefix of render(messages[:i+1]) and of the full conversation"
            )
        out.append((before, upto))
    return out


def render_with_mask(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask of assistant-produced tokens.

    See the module docstring for how spans are found and the trailing-token rule.
    With `add_generation_prompt` the ids end with the assistant header: a prompt
    as generation rendered it (the answer's stored ids follow, data/answers.py).
    """
    full = render(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    full_ids = encode(tokenizer, full)
    texts = _turn_texts(tokenizer, messages, full)
    spans = _token_spans(tokenizer, texts, full_ids)
    if spans is None:
        spans = _offset_spans(tokenizer, texts, full)
    stop = assistant_end_ids(tokenizer)
    mask = [0] * len(full_ids)
    for lo, hi in spans:
        end = next((k + 1 for k in range(lo, hi) if full_ids[k] in stop), hi)
        for k in range(lo, end):
            mask[k] = 1
    return full_ids, mask
