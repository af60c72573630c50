"""Multi-turn training conversations: every prompt answered, asked a follow-up question, answered again.

Why: chat users read second and later answers, written with the earlier ones
in the context (the target refers back to them, repeats their words); a
drafter trained on first answers alone never sees that kind of context.
`data build --turns N` answers each prompt, appends a follow-up question from
a fixed table, and lets the target answer again, N answers in all.

Only the last turn's generation keeps features: its forward runs over the
whole conversation, so it computes the earlier answers' features too, and
the loss mask covers every assistant turn (`lossmask.render_with_mask`). The
earlier answers enter that conversation as text, tokenised again by the chat
template, as a chat client sends them back to a server; the last answer keeps
the ids the target produced (data/answers.py).

The table is written apart from the held-out second-turn benchmark's
questions (`HELDOUT_FOLLOW_UPS`); a test asserts that no entry nearly copies
one of them.
"""

from __future__ import annotations

import random
from pathlib import Path

from eaglewire.data.generate import generate_responses
from eaglewire.data.jsonl import read_jsonl
from eaglewire.data.prompts import Conversation, prompt_turns

FOLLOW_UPS = [
    "Thanks! Could you make that shorter?", "Can you rewrite it in a more formal tone?",
    "Now turn that into a bulleted list.", "What would you add to that?",
    "Could you give me a real-world example?", "How would you explain this to a beginner?",
    "What are the main points again, briefly?", "Is there anything important you left out?",
    "Can you expand on the last part?", "What questions might someone ask after reading this?",
    "Please rewrite that for a young child.", "How could this go wrong?",
    "Write a catchy title for what you just wrote.", "What is the single most important idea here?",
    "Could you say the same thing in a friendlier way?", "Can you continue from where you stopped?",
    "Give me three follow-up ideas based on your answer.", "Which part of your answer is the least certain?",
    "How does that compare with the usual approach?", "Now write a short conclusion for it.",
    "Can you check your answer for mistakes?", "Put that into a table with two columns.",
    "What should I do first?", "Try again, but this time be more creative.",
]

# The held-out second turns (benchmarks/bench_multiturn.py), kept out of the training table above.
HELDOUT_FOLLOW_UPS = [
    "Can you explain that more simply?", "Give me one concrete example of that.",
    "Summarize your answer in two sentences.", "What is a common mistake people make here?",
    "Why does that matter?", "Can you go into more detail on the first point?",
]


def follow_up(index: int, turn: int, seed: int) -> str:
    """The question after answer `turn` of conversation `index`: fixed by (seed, index, turn), so a resumed run
    asks the same."""
    return FOLLOW_UPS[random.Random(f"{seed}:{index}:{turn}").randrange(len(FOLLOW_UPS))]


def turn_file(out: Path, turn: int) -> Path:
    """Where answer `turn` (1-based) of an N-turn build goes, for every turn but the last (responses.jsonl)."""
    return Path(out) / f"responses.turn{turn}.jsonl"


def with_follow_ups(convs: list[Conversation], answers: dict[int, str], turn: int, seed: int) -> list[Conversation]:
    """Conversation i with its answer and the next question appended; as it was when it has no answer
    (skipped as empty or too long: it is then asked as it was, one turn shorter)."""
    out = []
    for i, c in enumerate(convs):
        if i not in answers:
            out.append(c)
            continue
        msgs = prompt_turns(c) + [{"role": "assistant", "content": answers[i]},
                                  {"role": "user", "content": follow_up(i, turn, seed)}]
        out.append(Conversation(messages=msgs))
    return out


def earlier_turns(target, convs: list[Conversation], out: Path, s, turns: int, resume: bool) -> tuple[list, list[dict]]:
    """Answer turns 1..N-1 (no features kept) and return the conversations the last turn answers, with each
    earlier turn's generation figures."""
    figures = []
    for turn in range(1, turns):
        path = turn_file(out, turn)
        st = generate_responses(target, convs, path, s, resume=resume)
        answers = {r["index"]: r["messages"][-1]["content"] for r in read_jsonl(path) if "messages" in r}
        convs = with_follow_ups(convs, answers, turn, s.seed)
        figures.append({"turn": turn, "responses": st.done, "resumed": st.resumed, "skipped_empty": st.skipped_empty,
                        "skipped_long": st.skipped_long, "new_tokens": st.new_tokens,
                        "tokens_per_s": round(st.tokens_per_s, 1)})
    return convs, figures
