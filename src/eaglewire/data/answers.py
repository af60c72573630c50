"""The tokens a sample trains on: the target's own answer ids, not its answer's text tokenised again.

Why: decoding an answer and tokenising the text again is not the identity.
A `--max-new-tokens` cut in the middle of a multi-byte character decodes to
U+FFFD, and BPE merges text differently than the target sampled it (on a
tiny target one 12-token answer came back as 36 other tokens), so the
drafter would learn tokens the target never produced. Generation therefore
stores the ids it generated (`answer_ids` in `responses.jsonl`, beside the
text a person reads), and a sample is built as

    (the rendered prompt's ids) + (the stored answer ids) + (the template's end of turn)

with the same loss mask rule as `lossmask.render_with_mask`: 1 on the answer
and on the turn's tokens up to and including the first end-of-turn token,
0 after. Rows written before the field existed (and server answers whose
engine gives no ids) keep the text path: the whole conversation rendered and
tokenised. The manifest counts which way a dataset's tokens were made.
"""

from __future__ import annotations

from pathlib import Path

from eaglewire.data.jsonl import ANSWER_IDS, read_jsonl, response_problem
from eaglewire.data.lossmask import render_with_mask
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import SENTINEL_ASSISTANT, assistant_end_ids, encode, render

FROM_IDS, FROM_TEXT = "target_ids", "retokenized_text"


def _turn_end(tokenizer, messages: list[dict], stop: set[int]) -> tuple[list[int], list[int]]:
    """The template's tokens after an assistant answer, and their mask (1 through the first end-of-turn token)."""
    turn = messages[:-1] + [{"role": "assistant", "content": SENTINEL_ASSISTANT}]
    text = render(tokenizer, turn, add_generation_prompt=False)
    ids = encode(tokenizer, text.split(SENTINEL_ASSISTANT, 1)[1]) if SENTINEL_ASSISTANT in text else []
    end = next((k + 1 for k, t in enumerate(ids) if t in stop), len(ids))
    return ids, [1] * end + [0] * (len(ids) - end)


def sample_ids(tokenizer, row: dict, stop: set[int] | None = None) -> tuple[list[int], list[int]]:
    """(input ids, loss mask) of a `responses.jsonl` row: its `answer_ids` when it has them, else its text."""
    answer = row.get(ANSWER_IDS)
    if answer is None:  # a dataset made before answer ids were stored: its text, as then
        return render_with_mask(tokenizer, row["messages"])
    stop = assistant_end_ids(tokenizer) if stop is None else stop
    prompt, pmask = render_with_mask(tokenizer, row["messages"][:-1], add_generation_prompt=True)
    tail, tmask = _turn_end(tokenizer, row["messages"], stop)
    if answer[-1] in stop:  # the target ended the turn itself: only what the template writes after it follows
        k = next((k + 1 for k, t in enumerate(tail) if t in stop), 0)
        tail, tmask = tail[k:], [0] * (len(tail) - k)
    return prompt + list(answer) + tail, pmask + [1] * len(answer) + tmask


def answer_tokens(rows: list[dict]) -> dict:
    """How a dataset's answer tokens were made: {target_ids: rows with stored ids, retokenized_text: the rest}."""
    n = sum(1 for r in rows if r.get(ANSWER_IDS) is not None)
    return {FROM_IDS: n, FROM_TEXT: len(rows) - n}


def check_answer_vocab(path: Path, rows: list[dict], vocab_size: int) -> None:
    """Every stored answer id names a token of the target; else one line naming the file's line."""
    if all(max(r.get(ANSWER_IDS) or [0]) < vocab_size for r in rows):
        return
    read_jsonl(Path(path), check=lambda r: response_problem(r, vocab_size))  # raises naming the line
    raise EaglewireError(f"{path}: answer_ids outside the target's vocabulary of {vocab_size} tokens")
