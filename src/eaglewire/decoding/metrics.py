"""Per-request and aggregated speculative-decoding metrics.

Definitions (docs/conventions.md §4):

* tau (acceptance length) = accepted draft tokens + 1 bonus, per verify step,
  averaged over verify steps (vLLM convention). The prefill token is not a
  verify step and is counted separately (``prefill_tokens``).
* per-position acceptance, position i = the i-th draft token of a path:
  - ``cumulative[i]`` = steps whose accepted length >= i / steps that drafted
    a path of depth >= i (vLLM's per-position rate);
  - ``conditional[i]`` = steps with accepted >= i / steps with accepted >= i-1
    that drafted depth >= i (acceptance at i given that i-1 was accepted).
* ``accept_hist[a]`` = number of verify steps that emitted a+1 tokens.
* a verify step may carry no drafts (``--min-prob`` gated them off): it is a
  plain decode step that still feeds the drafter, and counts with tau 1.
* consistency: prefill_tokens + sum(accepted + bonus) - stop_trimmed == generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    drafted: int  # draft tokens sent to the target
    depth: int  # max path depth of the draft
    accepted: int  # draft tokens committed this step
    bonus: int  # 1 if the target's own token was committed, 0 if cut by a stop


@dataclass
class Metrics:
    steps: list[StepRecord] = field(default_factory=list)
    prefill_tokens: int = 0
    stop_trimmed: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    time: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "other": 0.0, "total": 0.0})

    def add(self, other: Metrics) -> None:
        """Aggregate another request into this one."""
        self.steps += other.steps
        self.prefill_tokens += other.prefill_tokens
        self.stop_trimmed += other.stop_trimmed
        self.generated += other.generated
        self.prompt_tokens += other.prompt_tokens
        for k, v in other.time.items():
            self.time[k] = self.time.get(k, 0.0) + v

    @property
    def tau(self) -> float | None:
        if not self.steps:
            return None
        return sum(s.accepted + s.bonus for s in self.steps) / len(self.steps)

    def per_position(self) -> dict[str, list[float]]:
        depth = max((s.depth for s in self.steps), default=0)
        cum, cond = [], []
        for i in range(1, depth + 1):
            drafted = [s for s in self.steps if s.depth >= i]
            ok = sum(s.accepted >= i for s in drafted)
            reached = sum(s.accepted >= i - 1 for s in drafted)
            cum.append(ok / len(drafted) if drafted else 0.0)
            cond.append(ok / reached if reached else 0.0)
        return {"cumulative": cum, "conditional": cond}

    def histogram(self) -> dict[int, int]:
        hist: dict[int, int] = {}
        for s in self.steps:
            n = s.accepted + s.bonus
            hist[n] = hist.get(n, 0) + 1
        return dict(sorted(hist.items()))

    def to_dict(self) -> dict:
        t = self.time
        pos = self.per_position()
        return {
            "generated_tokens": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "verify_steps": len(self.steps),
            "tau": self.tau,
            "accept_per_position": {
                "cumulative": pos["cumulative"],
                "conditional": pos["conditional"],
                "note": "cumulative[i] = P(accepted >= i+1 | drafted depth >= i+1); "
                        "conditional[i] = P(accepted >= i+1 | accepted >= i, drafted depth >= i+1)",
            },
            "accept_hist": {str(k): v for k, v in self.histogram().items()},
            "drafted_tokens": sum(s.drafted for s in self.steps),
            "rounds_without_drafts": sum(s.drafted == 0 for s in self.steps),  # --min-prob gated them off
            "accepted_tokens": sum(s.accepted for s in self.steps),
            "bonus_tokens": sum(s.bonus for s in self.steps),
            "prefill_tokens": self.prefill_tokens,
            "stop_trimmed": self.stop_trimmed,
            "time_s": dict(t),
            "tokens_per_s": self.generated / t["total"] if t.get("total") else None,
        }
