"""`doctor live`: does a running engine accept what eaglewire predicts, position by position?

The seeds' engine accepted ~1.6 of 16 drafted tokens and nothing said why.
Here the same prompts go to the server (greedy, one at a time, so batching
cannot change the numerics) and through eaglewire's own engine (chain of the
server's depth, every draft verified: vLLM drafts ungated). Served and
predicted acceptance are compared per position from vLLM's Prometheus
counters (`vllm:spec_decode_num_accepted_tokens_per_pos`, `..._num_drafts`):
a wiring bug changes what the drafter proposes, so some position diverges
even when the drafter hardly uses the shifted slot. On a FAIL the static
config check runs on the directory the server loaded and names the fix.

Tested here against vLLM 0.32 (CPU build) and llama.cpp's llama-server (from
llama-cpp-python 0.3.36's tree), whose `--metrics` page keeps the same counters
under `llamacpp:`. vLLM drafts every position; llama.cpp stops a round's
drafting at a step whose best draft probability (among its 10 best) is below
`--spec-draft-p-min`, which llama-server does not report: `p_min` names it, and
the prediction drafts by the same rule (`decoding.draft.step_confidence`).
SGLang reports acceptance per request (`meta_info.spec_verify_ct`),
not per position; it is not wired here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.decoding.engine import SpecConfig
from eaglewire.doctor.acceptance import decode_rounds, round_masks, unroll_predictions
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.doctor.records import trained_model_config
from eaglewire.doctor.verdict import Check, Report
from eaglewire.engines.llama_server import complete as llama_complete
from eaglewire.engines.vllm_server import (
    complete_ids,
    counter_delta,
    http_json,
    served_model,
    spec_counters,
)
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.points import Engine

# Allowed difference per position, in accepted drafts: the same prompts run through both engines, so
# in the same dtype the counts are equal (measured: equal to the count in float32 on CPU); bf16 on a GPU
# flips a few near-ties. A wiring bug moves them by far more (tests: one shifted slot, -30%).
SLACK_COUNT, SLACK_FRACTION = 2, 0.05


@dataclass
class Acceptance:
    """Acceptance counted the way vLLM counts it: per round that drafted, per draft position."""

    drafts: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    draft_tokens: int = 0  # tokens drafted over those rounds (0: not counted)

    @property
    def mean_length(self) -> float | None:
        """1 + accepted drafts per round (vLLM's 'mean acceptance length'; tau with the bonus token)."""
        return 1 + sum(self.accepted_per_pos) / self.drafts if self.drafts else None

    def add_round(self, accepted: int) -> None:
        """One round that drafted: positions 0 .. accepted-1 were accepted (vLLM's per-position counter)."""
        self.drafts += 1
        for p in range(min(accepted, len(self.accepted_per_pos))):
            self.accepted_per_pos[p] += 1

    def rates(self) -> list[float]:
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_pos]

    def to_dict(self) -> dict:
        return {"drafts": self.drafts, "accepted_per_pos": self.accepted_per_pos, "rates": self.rates(),
                "mean_acceptance_length": self.mean_length, "draft_tokens": self.draft_tokens}


def served_acceptance(url: str, prompts: list[list[int]], max_new_tokens: int,
                      target: list[str] | None = None, engine: Engine | None = None) -> tuple[Acceptance, int]:
    """(what the server accepted on these prompts, its draft depth), from counter deltas around the requests;
    `target`: names of the drafter's target, which the server must serve (None: whatever it serves).
    llama-server keeps vLLM's counters (under `llamacpp:`), so both are read the same way."""
    model = served_model(url, target)
    before = spec_counters(url)
    if engine is not None and engine.name == "llama.cpp":
        outputs = [llama_complete(url, ids, max_new_tokens)[0] for ids in prompts]
    else:
        outputs = [complete_ids(url, model, ids, max_new_tokens) for ids in prompts]
    delta = counter_delta(spec_counters(url), before, url)
    return (Acceptance(delta["drafts"], delta["accepted_per_pos"], outputs, delta["draft_tokens"]),
            len(delta["accepted_per_pos"]))


def predicted_acceptance(engine, prompts: list[list[int]], depth: int, max_new_tokens: int,
                         p_min: float = 0.0) -> Acceptance:
    """eaglewire's engine, chain of `depth`, greedy, gated per step at `p_min` as llama.cpp gates (0: every
    position drafted, as vLLM does): what a correctly wired server accepts. Rounds the gate left without
    drafts are not counted, as neither engine counts them."""
    acc = Acceptance(accepted_per_pos=[0] * depth)
    cfg = SpecConfig(mode="chain", depth=depth, min_prob=p_min, gate="step", max_new_tokens=max_new_tokens)
    for ids in prompts:
        r = engine.generate(ids, cfg)
        acc.outputs.append(r.token_ids)
        for s in r.metrics.steps:
            if s.drafted:
                acc.add_round(s.accepted)
                acc.draft_tokens += s.drafted
    return acc


def offline_acceptance(model, data_dir: Path, head_w, depth: int, num_samples: int) -> Acceptance:
    """Serving's rounds replayed on stored features, for targets too big to run here.

    One TTT-style unroll (`doctor drafter`) gives, at every answer position, how
    many of the next `depth` drafts match the target. A greedy server starts a
    round at the first answer token, accepts that many, and starts the next
    round after the bonus token; walking the same hops counts rounds and
    accepted positions the way vLLM does. It is close when the served answers
    are the stored ones, token for token: greedy serving of the same target
    reproduces them, provided the answers re-tokenize to themselves (real
    tokenizers do, almost always; the tests' random tiny targets do not).
    """
    ds = FeatureDataset(data_dir, verify=False)
    acc = Acceptance(accepted_per_pos=[0] * depth)
    with torch.no_grad():
        for i in range(0, min(num_samples, len(ds)), 4):
            b = collate([ds[j] for j in range(i, min(i + 4, num_samples, len(ds)))])
            pred, tgt, m = unroll_predictions(model, b, head_w, depth)
            drafted, walk = round_masks(b, depth)
            hit = ((pred + model.d2t[pred]) == tgt) & m & drafted  # [B, T, depth]
            run = torch.cumprod(hit.long(), dim=-1).sum(-1)  # [B, T] leading matches
            for row, starts in zip(run, walk):
                for r in decode_rounds(row, starts):
                    acc.add_round(r)
    return acc


def offline_tolerance(rate: float, n: int) -> float:
    """Teacher-forced positions are not the served rounds' positions: 5 points plus 2 standard errors."""
    return 0.05 + 2 * (max(rate * (1 - rate), 0.01) / max(n, 1)) ** 0.5


def tolerance(predicted_count: int, drafts: int) -> float:
    """The acceptance-rate difference allowed at a position whose predicted count is `predicted_count`."""
    return (SLACK_COUNT + SLACK_FRACTION * predicted_count) / max(drafts, 1)


def engine_of(url: str) -> Engine:
    """vLLM answers /version; llama-server answers /props with its model path and build."""
    try:
        props = http_json(url, "/props", timeout=30)
    except EaglewireError:
        props = None
    if isinstance(props, dict) and "model_path" in props and "default_generation_settings" in props:
        return Engine("llama.cpp", None)
    version = http_json(url, "/version", timeout=30).get("version")
    if version is not None and (not isinstance(version, str) or len(version) > 64):
        raise EaglewireError(f"{url}/version: expected `version` to be a short string, got {str(version)[:40]!r}")
    return Engine("vllm", version or None)


def compare(rep: Report, served: Acceptance, predicted: Acceptance, offline: bool = False) -> int | None:
    """Add the verdict rows; return the first diverging position (None when all agree)."""
    first_bad = None
    how = "offline estimate from stored features" if offline else "eaglewire predicts"
    for p, (s, q) in enumerate(zip(served.rates(), predicted.rates())):
        tol = (offline_tolerance(q, min(served.drafts, predicted.drafts)) if offline
               else tolerance(predicted.accepted_per_pos[p], predicted.drafts))
        ok = abs(s - q) <= tol
        first_bad = p if not ok and first_bad is None else first_bad
        rep.add(f"position {p}", ok, f"served accepts {s:.3f} ({served.accepted_per_pos[p]}/{served.drafts}), "
                f"{how} {q:.3f} ({predicted.accepted_per_pos[p]}/{predicted.drafts}), allowed +-{tol:.3f}",
                "the server feeds the drafter other features than training captured: see the config rows below")
    _draft_tokens(rep, served, predicted)
    ms, mp = served.mean_length or 1.0, predicted.mean_length or 1.0
    rep.add("mean acceptance length", first_bad is None, f"served {ms:.2f}, predicted {mp:.2f} (1 + accepted per round)",
            "fix the wiring named below; acceptance follows", level="warning")
    if offline:  # no engine ran here: there are no outputs to compare
        return first_bad
    n = len(served.outputs)
    same = [i for i in range(n) if served.outputs[i] == predicted.outputs[i]]
    detail = f"{len(same)} of {n} greedy outputs equal eaglewire's"
    if len(same) < n:
        i = next(i for i in range(n) if i not in same)
        a, b = served.outputs[i], predicted.outputs[i]
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        detail += f"; prompt {i} differs from token {k} (served {a[k:k + 3]}, eaglewire {b[k:k + 3]})"
    # speculative decoding is lossless: a different greedy output is the target, not the drafter
    rep.add("outputs", len(same) == n, detail, "outputs differ without speculation too when the served target or its "
            "dtype differ: serve the same checkpoint in float32 to compare exactly", level="warning")
    return first_bad


def _draft_tokens(rep: Report, served: Acceptance, predicted: Acceptance) -> None:
    """A server that gates its drafts drafts fewer tokens than an ungated prediction on the same prompts (whole
    rounds go undrafted, others stop early); its per-position counts then differ without any wiring bug, and
    this row says why. A miswired drafter drafts more, not fewer (lower acceptance, more rounds); both sides may
    cut a round short at the end of an answer, hence the 10%."""
    if not (served.draft_tokens and predicted.draft_tokens):
        return
    s, p = served.draft_tokens, predicted.draft_tokens
    rep.add("draft tokens", s >= 0.9 * p, f"served {s} over {served.drafts} rounds, eaglewire's prediction {p} over "
            f"{predicted.drafts}", "a server that gates its drafts (llama.cpp's --spec-draft-p-min) drafts fewer: "
            "give doctor live the same gate with --p-min", level="warning")


def doctor_live(url: str, engine, prompts: list[list[int]], max_new_tokens: int, static_check=None,
                offline=None, target: list[str] | None = None, p_min: float = 0.0) -> Report:
    """`engine`: eaglewire's SpecEngine with the trained drafter, or None with `offline(depth) -> Acceptance`
    (targets too big to run here); `static_check(Engine) -> Report | None` runs `doctor config` on what the
    server loaded (called on a FAIL, to name the fix); `target`: names of the drafter's target (its source, its
    directory): a server running another model is refused before anything is compared; `p_min`: llama-server's
    --spec-draft-p-min."""
    rep = Report("live")
    eng = engine_of(url)
    if p_min and (eng.name != "llama.cpp" or offline is not None):
        raise EaglewireError(f"--p-min {p_min}: only llama.cpp gates its drafts, and only a prediction that runs the "
                             f"target can gate the same way ({url} is {eng.label()}"
                             + (", checked offline)" if offline is not None else ")"))
    rep.add("engine", True, f"{eng.label()} at {url}" + "".join(f"; assumed: {a}" for a in eng.assumptions()))
    served, depth = served_acceptance(url, prompts, max_new_tokens, target, eng)
    if depth == 0 or served.drafts == 0:
        rep.checks.append(_no_drafts(url, eng, engine, prompts, max_new_tokens, p_min))
        return rep
    predicted = (offline(depth) if offline is not None
                 else predicted_acceptance(engine, prompts, depth, max_new_tokens, p_min))
    bad = compare(rep, served, predicted, offline=offline is not None)
    rep.data.update(served=served.to_dict(), predicted=predicted.to_dict(), depth=depth, prompts=len(prompts),
                    max_new_tokens=max_new_tokens, engine=eng.label(), p_min=p_min,
                    tolerance={"count": SLACK_COUNT, "fraction": SLACK_FRACTION})
    if bad is not None and static_check is not None:
        cfg_rep = static_check(eng)
        if cfg_rep is not None:
            for c in cfg_rep.checks:
                rep.checks.append(c)
    return rep


def _no_drafts(url: str, eng: Engine, engine, prompts: list[list[int]], max_new_tokens: int, p_min: float) -> Check:
    """Why nothing can be compared. A round drafts iff its first step passes the gate, whatever the depth, so a
    one-step prediction tells a gate that never opens for this drafter from a server that does not speculate."""
    n = len(prompts)
    if p_min and engine is not None and predicted_acceptance(engine, prompts, 1, max_new_tokens, p_min).drafts == 0:
        return Check("speculation", False, f"{url} drafted nothing at --spec-draft-p-min {p_min:g} on {n} prompts, "
                     f"nor does eaglewire's prediction: this drafter's best first draft never reaches {p_min:g}",
                     "serve with a lower --p-min (0 drafts every position): nothing is checked, or sped up, while "
                     "nothing is drafted")
    how = ("start llama-server with --metrics, -md DRAFTER.gguf --spec-type draft-eagle3" if eng.name == "llama.cpp"
           else "start vLLM with --speculative-config (method eagle3) naming the exported drafter")
    return Check("speculation", False, f"{url} reports no speculative drafts for {n} prompts", how)


def static_check_for(export_dir: Path | None, trained: list[str], num_layers: int, arch: str | None):
    """A `static_check` running `doctor config` on the directory the server loaded, when it is known."""
    if export_dir is None:
        return None

    def run(eng: Engine) -> Report | None:
        return doctor_config(export_dir, Engine(eng.name, eng.version, arch), num_layers, trained, None, None,
                             trained_model_config(Path(export_dir)))

    return run
