"""Prompt sources: files in common chat formats (JSONL, ShareGPT JSON, parquet), and Magpie-style self-prompts.

The drafter is trained on the target's OWN answers (regenerated), so only the
prompt side of a dataset matters; assistant turns found in files are kept as
context for earlier turns but the final answer is always regenerated.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.data.jsonl import read_jsonl
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import SENTINEL_USER, encode, first_added_in, render

ROLES = ("system", "user", "assistant")
# "chatgpt", "bing" and "bard" name the answering model in raw ShareGPT dumps
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
EXPECTED_SHAPES = ('a JSON string, {"prompt": str}, {"text": str}, '
                   '{"conversations": [{"from", "value"}...]} (ShareGPT) or {"messages": [{"role", "content"}...]}')


def _normalize(text: str) -> str:
    """Case-, width- and whitespace-insensitive form, so trivial variants dedupe together."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


@dataclass
class Conversation:
    """A chat as role/content messages (roles: system, user, assistant)."""

    messages: list[dict] = field(default_factory=list)

    def key(self) -> str:
        """Stable de-duplication key: hash of the normalized user turns only.

        System prompts and assistant answers are ignored because the answers
        are regenerated and the same question under another system prompt
        adds little drafter signal.
        """
        users = [_normalize(m["content"]) for m in self.messages if m["role"] == "user"]
        return hashlib.sha256(json.dumps(users, ensure_ascii=False).encode()).hexdigest()[:32]


def _content(value, where: str) -> str:
    """Message content as a string; OpenAI content-part lists are joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise EaglewireError(f"{where}: expected a string (or a list of {{'type': 'text'}} parts), got {type(value).__name__}")


def _turns(items, where: str, role_key: str, text_key: str, roles: dict) -> list[dict]:
    if not isinstance(items, list) or not items:
        raise EaglewireError(f"{where}: expected a non-empty list of turns")
    out = []
    for k, turn in enumerate(items):
        at = f"{where}[{k}]"
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise EaglewireError(f"{at}: expected an object with '{role_key}' and '{text_key}'")
        role = roles.get(turn[role_key]) if isinstance(turn[role_key], str) else None
        if role is None:
            raise EaglewireError(f"{at}.{role_key}: {turn[role_key]!r} is not one of {', '.join(sorted(roles))}")
        out.append({"role": role, "content": _content(turn[text_key], f"{at}.{text_key}")})
    return out


def parse_record(obj, where: str) -> Conversation:
    """One decoded JSON line -> Conversation; `where` is ``file:line`` for errors."""
    if isinstance(obj, str):
        msgs = [{"role": "user", "content": obj}]
    elif isinstance(obj, dict) and "messages" in obj:
        msgs = _turns(obj["messages"], f"{where}: messages", "role", "content", {r: r for r in ROLES})
    elif isinstance(obj, dict) and "conversations" in obj:
        msgs = _turns(obj["conversations"], f"{where}: conversations", "from", "value", SHAREGPT_ROLES)
    elif isinstance(obj, dict) and ("prompt" in obj or "text" in obj):
        k = "prompt" if "prompt" in obj else "text"
        msgs = [{"role": "user", "content": _content(obj[k], f"{where}: {k}")}]
    else:
        raise EaglewireError(f"{where}: unknown record shape {type(obj).__name__} (expected {EXPECTED_SHAPES})")
    if not any(m["role"] == "user" and m["content"].strip() for m in msgs):
        raise EaglewireError(f"{where}: no non-empty user turn (expected at least one)")
    return Conversation(msgs)


def dedupe(convs: list[Conversation]) -> tuple[list[Conversation], int]:
    """Keep the first conversation per :meth:`Conversation.key`; return (kept, n_dropped)."""
    seen, kept = set(), []
    for c in convs:
        k = c.key()
        if k not in seen:
            seen.add(k)
            kept.append(c)
    return kept, len(convs) - len(kept)


# a generated prompt this close to a held-out one (word Jaccard) would leak the evaluation into training
NEAR_COPY_JACCARD = 0.6


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.casefold()))


def _user_text(conv: Conversation) -> str:
    return " ".join(m["content"] for m in conv.messages if m["role"] == "user")


def heldout_prompt_texts() -> list[str]:
    """The shipped held-out prompts (what `doctor drafter` and `bench` measure generalisation on)."""
    return [r["prompt"] for r in read_jsonl(heldout_prompts_path())]


def drop_heldout(convs: list[Conversation], heldout: list[str]) -> tuple[list[Conversation], int]:
    """Drop conversations whose user turns nearly copy a held-out prompt; return (kept, n_dropped).

    Held-out acceptance is only a measure of generalisation while no training
    prompt restates an evaluation prompt, so generated prompts (composed,
    self-written) pass through this before any answer is made for them.
    """
    held = [w for w in map(_words, heldout) if w]
    kept = []
    for c in convs:
        w = _words(_user_text(c))
        if not any(len(w & h) >= NEAR_COPY_JACCARD * len(w | h) for h in held):
            kept.append(c)
    return kept, len(convs) - len(kept)


def prompt_turns(conv: Conversation) -> list[dict]:
    """Messages up to and including the last user turn: the prompt to regenerate an answer for.

    Choice: only the FINAL answer is regenerated. Earlier assistant turns are
    kept as written in the dataset: context for the final answer (the loss
    mask still covers them, and the labels are the target's own predictions
    over them); regenerating them would need one sequential generation per
    turn and would drift the conversation away from its later user turns.
    `data build --turns N` makes conversations whose every answer is the
    target's own (data/turns.py).
    """
    last = max((i for i, m in enumerate(conv.messages) if m["role"] == "user"), default=None)
    if last is None:
        raise EaglewireError("conversation has no user turn (expected at least one)")
    return [dict(m) for m in conv.messages[: last + 1]]


@dataclass
class SelfPromptCounts:
    """What happened to the sampled user turns (for the run log)."""

    requested: int = 0
    generated: int = 0
    empty: int = 0  # empty or shorter than min_chars after stripping
    duplicate: int = 0
    unterminated: int = 0  # hit max_new_tokens without an end-of-turn token (kept)


def user_turn_template(tokenizer) -> tuple[str, set[int]]:
    """(prefix that opens a user turn, ids that close it), found by rendering a sentinel.

    The prefix is the rendering cut at the sentinel (so it carries BOS and any
    default system prompt). The closer is the first special token the
    template emits after the user content when a reply follows (``<|im_end|>``,
    ``<|eot_id|>``, ``[/INST]``, ``<｜Assistant｜>``).
    """
    text = render(tokenizer, [{"role": "user", "content": SENTINEL_USER}], add_generation_prompt=True)
    if SENTINEL_USER not in text:
        raise EaglewireError("chat template drops the user content (expected it to render user messages)")
    prefix, tail = text.split(SENTINEL_USER, 1)
    closer = first_added_in(tokenizer, tail)
    return prefix, ({closer} if closer is not None else set())


def _sample_batch(target, prefix_ids: list[int], bsz: int, stop: list[int], **gen) -> list[list[int]]:
    """Sample `bsz` user turns from the same prefix; returns new tokens cut at the first stop id."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
    # identical prefixes need no padding; the mask is still passed so generate never guesses it
    ids = torch.tensor([prefix_ids] * bsz, dtype=torch.long, device=target.device)
    out = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                eos_token_id=stop, pad_token_id=pad, **gen)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = next((k for k, t in enumerate(row) if t in stop), None)
        rows.append(row if cut is None else row[:cut] + [None])  # None marks "terminated"
    return rows


def self_prompts(target, n: int, seed: int, max_new_tokens: int = 64, batch_size: int = 16,
                 temperature: float = 1.0, top_p: float = 0.95, min_chars: int = 3,
                 max_attempts: int | None = None) -> tuple[list[Conversation], SelfPromptCounts]:
    """Magpie-style prompts: let the instruct target write the user turn itself.

    The chat template is rendered up to the start of a user turn and the
    target samples until it closes the turn. Empty/short and duplicate
    prompts are dropped; sampling continues until `n` unique prompts or
    `max_attempts` samples (default 4n + batch_size), so fewer than n may come back.
    """
    tok = target.tokenizer
    prefix, closers = user_turn_template(tok)
    prefix_ids = encode(tok, prefix)
    stop = sorted(set(target.eos_ids()) | closers)
    budget = max_attempts if max_attempts is not None else 4 * n + batch_size
    counts, seen, convs = SelfPromptCounts(requested=n), set(), []
    torch.manual_seed(seed)
    with tqdm(total=n, desc="self-prompts", unit="prompt", leave=False) as bar:
        while len(convs) < n and counts.generated < budget:
            bsz = min(batch_size, budget - counts.generated)
            rows = _sample_batch(target, prefix_ids, bsz, stop, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_p=top_p)
            for row in rows:
                counts.generated += 1
                counts.unterminated += int(row[-1:] != [None])
                text = tok.decode([t for t in row if t is not None], skip_special_tokens=True).strip()
                conv = Conversation([{"role": "user", "content": text}])
                if len(text) < min_chars:
                    counts.empty += 1
                elif conv.key() in seen or len(convs) >= n:
                    counts.duplicate += conv.key() in seen
                else:
                    seen.add(conv.key())
                    convs.append(conv)
                    bar.update(1)
    return convs, counts
