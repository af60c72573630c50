"""The target's chat template: rendering messages and encoding the result, one definition for data, decoding and serving.

Everything that turns messages into the target's tokens goes through here, so
a prompt is the same tokens whether it is trained on, decoded or sent to an
engine."""

from __future__ import annotations

from eaglewire.infra.errors import EaglewireError

SENTINEL_USER = "\x00SENTINEL_USER\x00"


SENTINEL_ASSISTANT = "\x00SENTINEL_ASSISTANT\x00"


def render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    """Render messages with the tokenizer's chat template, as a string.

    Strings (not token ids) are the common currency so the same rendering can
    be tokenized with or without offsets.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise EaglewireError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')}: has no chat_template "
            "(expected an instruct/chat model)"
        )
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja raise_exception(...) in templates, e.g. role alternation checks
        roles = ",".join(m.get("role", "?") for m in messages)
        raise EaglewireError(
            f"chat template rejected a conversation with roles [{roles}] ({type(e).__name__}: {e})"
        ) from e


def encode(tokenizer, text: str) -> list[int]:
    """Tokenize a rendered template; the template already contains any BOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def added_ids(tokenizer) -> set[int]:
    """Ids of added/special tokens (turn markers are always among them)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(tok, "special", True):
            ids.add(int(i))
    return ids


def first_added_in(tokenizer, text: str) -> int | None:
    special = added_ids(tokenizer)
    return next((i for i in encode(tokenizer, text) if i in special), None)


def assistant_end_ids(tokenizer) -> set[int]:
    """Tokens that end an assistant turn: eos plus the template's turn closer.

    The closer is the first special token the template emits after an
    assistant content (found by rendering a sentinel), e.g. ``<|im_end|>``,
    ``<|eot_id|>``, ``</s>``.
    """
    msgs = [{"role": "user", "content": SENTINEL_USER}, {"role": "assistant", "content": SENTINEL_ASSISTANT}]
    text = render(tokenizer, msgs, add_generation_prompt=False)
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if SENTINEL_ASSISTANT in text:
        closer = first_added_in(tokenizer, text.split(SENTINEL_ASSISTANT, 1)[1])
        if closer is not None:
            ids.add(closer)
    return ids
