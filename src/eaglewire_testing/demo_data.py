"""A made-up finished demo run: stage results built from raw timings the way `run_bench` builds them.

The report's sentences must follow from these numbers, so the tests state the
raw timings and let the library derive every ratio; nothing expected is copied
from a real run.
"""

from eaglewire.decoding.bench import _median, _spread

# tokens/s per repeat; plain is the baseline of every speculative ratio
TPS = {"hf_generate": [12.0, 12.0], "eaglewire_plain": [10.0, 10.0], "eaglewire_chain": [11.0, 12.0],
       "eaglewire_tree": [13.0, 12.6], "eaglewire_tree_lookup": [14.1, 15.5]}
TAU = {"eaglewire_chain": 1.5, "eaglewire_tree": 1.7, "eaglewire_tree_lookup": 1.9}
PROMPT_FACTORS = (0.9, 1.0, 1.2)  # each prompt's ratio over the first repeat's: the per-prompt spread
# prompts per category (3 in all): math rests on one prompt, writing on two
CATEGORIES = {"math": 1, "writing": 2}
STAGE_SECONDS = {"data": 330.0, "train": 240.0, "doctor": 12.0, "bench": 114.0}


DRAFT_S, VERIFY_S = 0.004, 0.05  # a round's draft and verify time in the synthetic bench


def synthetic_bench(repeats: int = 2, differ: dict | None = None, min_prob: float = 0.1,
                    tps: dict | None = None) -> dict:
    """``tps`` replaces some methods' tokens/s per repeat (TPS's shape), to make e.g. a chain within noise."""
    methods, rates = {}, TPS | (tps or {})
    for name, rate in rates.items():
        tps = rate[:repeats]
        vs_plain = [a / b for a, b in zip(tps, rates["eaglewire_plain"])]
        vs_hf = [a / b for a, b in zip(tps, rates["hf_generate"])]
        row = {"tokens": 600, "seconds": 600 / _median(tps), "tokens_per_s": _median(tps), "tokens_per_s_spread": _spread(tps),
               "speedup": _median(vs_hf), "speedup_spread": _spread(vs_hf),
               "speedup_vs_plain": _median(vs_plain), "speedup_vs_plain_spread": _spread(vs_plain),
               "speedup_vs_plain_per_prompt": _spread([vs_plain[0] * f for f in PROMPT_FACTORS]),
               "differ_from_baseline": (differ or {}).get(name, 0)}
        if name in TAU:
            row.update(tau=TAU[name], verify_steps=400, rounds_without_drafts=40,
                       time_s={"draft": 400 * DRAFT_S, "verify": 400 * VERIFY_S, "prefill": 0.5, "other": 0.1},
                       accept_per_position={"cumulative": [0.4, 0.2]})
        methods[name] = row
    return {"max_new_tokens": 64, "num_prompts": 3, "repeats": repeats, "methods": methods,
            "categories": _categories(methods),
            "config": {"depth": 4, "top_k": 3, "tree_depth": 2, "total_tokens": 7, "min_prob": min_prob},
            "plain_vs_hf_generate": methods["eaglewire_plain"]["speedup"],
            "greedy_outputs_match": not any((differ or {}).values())}


def _categories(methods: dict) -> dict:
    """A category's speedup: the mean of its prompts' ratios (prompt i has PROMPT_FACTORS[i]), in CATEGORIES' order."""
    out, i = {}, 0
    for cat, n in CATEGORIES.items():
        f = sum(PROMPT_FACTORS[i:i + n]) / n
        out[cat] = {"prompts": n} | {m: {"tau": TAU[m], "speedup_vs_plain": r["speedup_vs_plain"] * f}
                                      for m, r in methods.items() if m in TAU}
        i += n
    return out


def check(name: str, ok: bool = True, level: str = "info", fix: str = "") -> dict:
    return {"name": name, "ok": ok, "detail": f"{name} detail", "level": level, "fix": fix}


def synthetic_log(bench: dict | None = None, drafter_checks: list | None = None) -> dict:
    """A happy path: every doctor check passes, the exports checked against the training config."""
    config = {"command": "config", "ok": True, "engine": "sglang",
              "checks": [check(n) for n in ("eagle3 head", "points", "rope / norm")]}
    drafter = {"command": "drafter", "ok": True, "split": "the held-out validation split (16 samples)",
               "checks": drafter_checks or [check("points"), check("accuracy"), check("offline acceptance"), check("d2t")],
               "offline": {"depth": 4, "tau_chain": 1.8, "acc": [0.5, 0.4], "mean_acceptance_length": 1.6,
                           "mean_acceptance_length_ci95": [1.5, 1.7], "samples": 16}}
    s = STAGE_SECONDS
    return {"data": {"vocab": {"size": 200, "coverage": 0.973}, "extract": {"num_samples": 320, "num_tokens": 50000},
                     "seconds": s["data"]},
            "train": {"validation": {"acc": [0.5, 0.4]}, "steps": 300, "seconds": s["train"]},
            "doctor": {"reports": [{"command": "dataset", "ok": True, "checks": [check("slot 0"), check("slot 1")]},
                                   drafter, config, config | {"engine": "vllm"}], "seconds": s["doctor"]},
            "bench": {"seconds": s["bench"]} | (bench or synthetic_bench())}
