"""The draft depths eaglewire defaults to, each defined once and imported wherever a depth is defaulted.

Why in `saved/`: a depth is part of what a saved drafter is exported and served with (vLLM
num_speculative_tokens, SGLang --speculative-num-steps, speculators speculative_tokens, llama.cpp
--spec-draft-n-max), and every room that defaults one (engines, export, decoding, doctor, serve, demo)
sits above this one.
"""

# The one default depth, draft tokens per round: `generate`, `bench`, `doctor drafter`, `doctor online`, `serve`
# and the exports take it, and every acceptance figure names the depth it was measured at. 3 is vLLM's usual
# EAGLE-3 setting and the depth held-out acceptance is judged at.
DEPTH = 3

# The demo's llama.cpp stage's own: measured on this CPU (docs/results.md, llama.cpp's draft gate), depth 2 and 3
# tie under the gate it serves with (`--spec-draft-p-min` 0.5: 0.97x each) and depth 2 loses least ungated
# (0.93x against 0.82x), where a third draft is rarely accepted and each one is a serial drafter step.
LLAMA_CPP_DEPTH = 2


def resolved_depth(depth: int, own: int) -> int:
    """`--depth` as given, or the drafter's `own` depth when left at 0 (the default of `export` and `serve`).

    Why 0 and not DEPTH as the default: a P-EAGLE drafter trained for 4 parallel depths (or a DFlash block of
    5) must keep them unless told otherwise, and a --depth 3 given on purpose must not be read as "not given".
    `own` is the depths a P-EAGLE drafter was trained for, a DFlash block's slots, else DEPTH."""
    return depth or own
