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
SGLang (0.5.23) has no counters page: each /generate reply's `meta_info` says
how many rounds it verified (`spec_verify_ct`) and how many rounds accepted k
drafts (`spec_correct_drafts_histogram`), which sum to vLLM's per-position
counts; its draft depth and tree width come from /server_info. Only a chain
(`--speculative-eagle-topk 1`) is predicted.

A server is checked as hostile: its counters must be possible (positions
0..depth-1, no position accepted more often than rounds were drafted, nor more
often than the position before it) before anything is compared, or the server
is named as the fault, not the wiring. The whole check runs under one deadline
(`--deadline`), stated at the start, with a line per prompt: every network
wait is cut to what is left of it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglewire.data.dataset import FeatureDataset, collate
from eaglewire.decoding.acceptance import decode_rounds, round_masks, unroll_predictions
from eaglewire.decoding.engine import SpecConfig
from eaglewire.doctor.engine_config import doctor_config
from eaglewire.doctor.records import trained_model_config
from eaglewire.doctor.verdict import Check, Report
from eaglewire.engines import sglang
from eaglewire.engines.http import ChatClient, DeadlineExpired, RequestFailed, bounded, deadline
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
DEFAULT_DEADLINE_S = 900.0  # the whole check: 8 prompts of 64 tokens take well under a minute on a CPU vLLM
PROPS_TIMEOUT_S, PROPS_BYTES = 30.0, 4 << 20  # llama-server's /props: a few kB (settings and the chat template)


@dataclass
class Progress:
    """How far a live check got: the progress lines, and the deadline's error line."""

    url: str
    seconds: float
    prompts: int
    stage: str = "identifying the engine (/props, /server_info, /version)"
    answered: int = 0
    say: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))
    t0: float = field(default_factory=time.monotonic)

    def step(self, stage: str) -> None:
        self.stage = stage

    def prompt_done(self, who: str, i: int, tokens: int, t: float) -> None:
        self.say(f"[live] {who}: prompt {i + 1}/{self.prompts} ({tokens} tokens in {time.monotonic() - t:.1f} s; "
                 f"{time.monotonic() - self.t0:.0f} of {self.seconds:g} s used)")

    def expired_error(self) -> EaglewireError:
        return EaglewireError(f"{self.url}: doctor live's deadline of {self.seconds:g} s ran out while {self.stage} "
                              f"({self.answered} of {self.prompts} prompts answered by the server): a server this "
                              "slow cannot be checked in time; raise --deadline, or send fewer or shorter prompts "
                              "(--num-prompts, --max-new-tokens)")


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
                      target: list[str] | None = None, engine: Engine | None = None,
                      progress: Progress | None = None) -> tuple[Acceptance, int]:
    """(what the server accepted on these prompts, its draft depth), from counter deltas around the requests;
    `target`: names of the drafter's target, which the server must serve (None: whatever it serves).
    llama-server keeps vLLM's counters (under `llamacpp:`), so both are read the same way. Counters no
    speculating server can count raise ImpossibleCounters."""
    prog = progress or Progress(url, DEFAULT_DEADLINE_S, len(prompts), say=lambda m: None)
    prog.step("listing the served models (/v1/models)")
    model = served_model(url, target)
    if engine is not None and engine.name == "sglang":
        return served_sglang(url, prompts, max_new_tokens, prog)
    prog.step("reading the counters before the prompts (/metrics)")
    before = spec_counters(url)
    outputs = []
    for i, ids in enumerate(prompts):
        prog.step(f"waiting for the server's answer to prompt {i + 1} of {len(prompts)}")
        t = time.monotonic()
        if engine is not None and engine.name == "llama.cpp":
            outputs.append(llama_complete(url, ids, max_new_tokens)[0])
        else:
            outputs.append(complete_ids(url, model, ids, max_new_tokens))
        prog.answered += 1
        prog.prompt_done("server", i, len(outputs[-1]), t)
    prog.step("reading the counters after the prompts (/metrics)")
    after = spec_counters(url)
    delta = counter_delta(after, before, url)
    served = Acceptance(delta["drafts"], delta["accepted_per_pos"], outputs, delta["draft_tokens"])
    why = counter_problem(before, after, delta)
    if why is not None:
        raise ImpossibleCounters(f"{url}/metrics: {why}", served)
    return served, len(delta["accepted_per_pos"])


def served_sglang(url: str, prompts: list[list[int]], max_new_tokens: int, prog: Progress) -> tuple[Acceptance, int]:
    """SGLang's acceptance on these prompts, summed from each reply's meta_info into vLLM's per-position counts
    (a round that accepted k drafts accepted positions 0..k-1); depth 0 when the server does not speculate."""
    prog.step(f"reading the speculative settings ({sglang.SERVER_INFO_ROUTES[0]})")
    info, why = _sglang_info(url)
    if info is None:
        raise EaglewireError(f"{url}{sglang.SERVER_INFO_ROUTES[0]}: {why}")
    spec = sglang.spec_settings(url, info)
    depth, topk = spec["speculative_num_steps"] or 0, spec["speculative_eagle_topk"] or 1
    if spec["speculative_algorithm"] in (None, "", "NONE") or not depth:
        return Acceptance(), 0
    if topk != 1:
        raise EaglewireError(f"{url}{sglang.SERVER_INFO_ROUTES[0]}: speculative_eagle_topk is {topk}: SGLang drafts a "
                             "tree, eaglewire predicts a chain; serve with --speculative-eagle-topk 1 "
                             f"--speculative-num-draft-tokens {depth + 1} to check the wiring")
    served = Acceptance(accepted_per_pos=[0] * depth)
    for i, ids in enumerate(prompts):
        prog.step(f"waiting for the server's answer to prompt {i + 1} of {len(prompts)}")
        t = time.monotonic()
        out, meta = sglang.read_generate(url, http_json(url, sglang.GENERATE_ROUTE,
                                                        sglang.generate_body(ids, max_new_tokens)))
        hist, bad = sglang.round_counts(meta, len(out), depth)
        if bad is not None:
            raise ImpossibleCounters(f"{url}{sglang.GENERATE_ROUTE} (prompt {i + 1}): {bad}", served)
        served.outputs.append(out)
        for k, rounds in enumerate(hist):
            for _ in range(rounds):
                served.add_round(k)
        prog.answered += 1
        prog.prompt_done("server", i, len(out), t)
    served.draft_tokens = served.drafts * depth
    labels = {"accepted_per_pos": dict.fromkeys(range(depth), 0)}
    why = counter_problem(labels, labels, {"drafts": served.drafts, "accepted_per_pos": served.accepted_per_pos,
                                           "draft_tokens": served.draft_tokens})
    if why is not None:
        raise ImpossibleCounters(f"{url}{sglang.GENERATE_ROUTE}: {why}", served)
    return served, depth


class ImpossibleCounters(EaglewireError):
    """The server's counters for this run cannot have been counted by a speculating server: its fault."""

    def __init__(self, msg: str, served: Acceptance):
        super().__init__(msg)
        self.served = served


def counter_problem(before: dict, after: dict, delta: dict) -> str | None:
    """Why this run's counters cannot be what a speculating server counted (None: they can). Both engines count,
    per round that drafted, the positions accepted from the first on: position p is accepted only in a round
    that drafted and accepted every position before it, and at most once per round."""
    labels = sorted(set(after["accepted_per_pos"]) | set(before["accepted_per_pos"]))
    if labels != list(range(len(labels))):
        return (f"accepted-token counters are labelled position {', '.join(map(str, labels[:8]))}"
                f"{', ...' if len(labels) > 8 else ''}: not 0..{len(labels) - 1}, one per draft position")
    drafts, acc = delta["drafts"], delta["accepted_per_pos"]
    over = next((p for p, a in enumerate(acc) if a > drafts), None)
    if over is not None and drafts == 0:
        return f"{acc[over]} accepted at position {over} while no round drafted"
    if over is not None:
        return (f"{acc[over]} accepted at position {over} over {drafts} draft{'s' * (drafts != 1)} (a round accepts "
                f"a position at most once; mean acceptance length {1 + sum(acc) / drafts:.2f}, possible only in "
                f"[1, {len(acc) + 1}])")
    rise = next((p for p in range(1, len(acc)) if acc[p] > acc[p - 1]), None)
    if rise is not None:
        return (f"{acc[rise]} accepted at position {rise} but {acc[rise - 1]} at position {rise - 1} (a draft is "
                "accepted only after every draft before it)")
    if delta["draft_tokens"] and sum(acc) > delta["draft_tokens"]:
        return f"{sum(acc)} drafts accepted but {delta['draft_tokens']} drafted"
    return None


def predicted_acceptance(engine, prompts: list[list[int]], depth: int, max_new_tokens: int,
                         p_min: float = 0.0, progress: Progress | None = None) -> Acceptance:
    """eaglewire's engine, chain of `depth`, greedy, gated per step at `p_min` as llama.cpp gates (0: every
    position drafted, as vLLM does): what a correctly wired server accepts. Rounds the gate left without
    drafts are not counted, as neither engine counts them."""
    acc = Acceptance(accepted_per_pos=[0] * depth)
    cfg = SpecConfig(mode="chain", depth=depth, min_prob=p_min, gate="step", max_new_tokens=max_new_tokens)
    for i, ids in enumerate(prompts):
        if progress is not None:  # local work, but under the same deadline as the server's answers
            progress.step(f"predicting prompt {i + 1} of {len(prompts)} with eaglewire's engine")
            bounded(0.0)
        t = time.monotonic()
        r = engine.generate(ids, cfg)
        acc.outputs.append(r.token_ids)
        if progress is not None:
            progress.prompt_done("eaglewire's prediction", i, len(r.token_ids), t)
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
    ds = FeatureDataset(data_dir, verify=False, check_order=False)
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
    """vLLM answers /version; llama-server answers /props with its model path and build; SGLang (which has no
    /version) answers /server_info with its launch settings. When none does, the error names every route and what
    each answered: a llama-server whose /props is broken is not a vLLM."""
    props, why = _props(url)
    if props is not None:
        return Engine("llama.cpp", None)
    info, sg_why = _sglang_info(url)
    if info is not None:
        v = info.get("version")
        return Engine("sglang", v if isinstance(v, str) and 0 < len(v) <= 64 else None)
    try:
        version = http_json(url, "/version", timeout=30).get("version")
    except DeadlineExpired:
        raise
    except EaglewireError as e:
        raise EaglewireError(f"{url}: neither llama-server, SGLang nor vLLM: /props {why} (llama-server answers an "
                             f"object with model_path and default_generation_settings), {' and '.join(sglang.SERVER_INFO_ROUTES)} "
                             f"{sg_why} (SGLang answers an object with speculative_algorithm), and {str(e).partition(': <')[0]}") from e
    if version is not None and (not isinstance(version, str) or len(version) > 64):
        raise EaglewireError(f"{url}/version: expected `version` to be a short string, got {str(version)[:40]!r}")
    return Engine("vllm", version or None)


def _props(url: str) -> tuple[dict | None, str]:
    """llama-server's /props (None when it is not one) and what was wrong with the reply, read under a size cap."""
    client = ChatClient(url, timeout_s=PROPS_TIMEOUT_S, retries=0, max_bytes=PROPS_BYTES, timeout_flag="")
    try:
        props = client.request("/props")[0]
    except RequestFailed as e:
        return None, f"failed ({e})"
    if not isinstance(props, dict):
        return None, f"answered a JSON {type(props).__name__} ({str(props)[:40]})"
    missing = [k for k in ("model_path", "default_generation_settings") if k not in props]
    if missing:
        return None, f"answered an object without {' and '.join(missing)}"
    return props, ""


def _sglang_info(url: str) -> tuple[dict | None, str]:
    """SGLang's /server_info (or the older /get_server_info; None when it is not SGLang) and what was wrong."""
    client = ChatClient(url, timeout_s=PROPS_TIMEOUT_S, retries=0, max_bytes=PROPS_BYTES, timeout_flag="")
    why = ""
    for route in sglang.SERVER_INFO_ROUTES:
        try:
            info = client.request(route)[0]
        except RequestFailed as e:  # the route's status, not the error page: the line names several routes
            why = f"failed ({str(e).partition(': <')[0][:80]})"
            continue
        if isinstance(info, dict) and "speculative_algorithm" in info:
            return info, ""
        why = (f"answered {'an object' if isinstance(info, dict) else 'a JSON ' + type(info).__name__} without "
               "speculative_algorithm")
    return None, why


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
                offline=None, target: list[str] | None = None, p_min: float = 0.0,
                deadline_s: float = DEFAULT_DEADLINE_S, say: Callable[[str], None] | None = None,
                gate_from: str = "") -> Report:
    """`engine`: eaglewire's SpecEngine with the trained drafter, or None with `offline(depth) -> Acceptance`
    (targets too big to run here); `static_check(Engine) -> Report | None` runs `doctor config` on what the
    server loaded (called on a FAIL, to name the fix); `target`: names of the drafter's target (its source, its
    directory): a server running another model is refused before anything is compared; `p_min`: llama-server's
    --spec-draft-p-min (`gate_from`: the record it came from, not the user: then it applies to llama.cpp only);
    `deadline_s`: the whole check, network waits and prediction (`say`: progress lines, default stderr)."""
    prog = Progress(url, deadline_s, len(prompts), **({"say": say} if say is not None else {}))
    prog.say(f"[live] checking {url} on {len(prompts)} prompts of up to {max_new_tokens} new tokens; deadline "
             f"{deadline_s:g} s for the whole check (--deadline)")
    try:
        with deadline(deadline_s, f"{url}: doctor live's deadline of {deadline_s:g} s ran out"):
            return _live_check(url, engine, prompts, max_new_tokens, static_check, offline, target, p_min, prog,
                               gate_from)
    except EaglewireError as e:
        if isinstance(e, DeadlineExpired) or time.monotonic() - prog.t0 >= deadline_s:
            raise prog.expired_error() from e
        raise


def _live_check(url: str, engine, prompts: list[list[int]], max_new_tokens: int, static_check, offline,
                target: list[str] | None, p_min: float, prog: Progress, gate_from: str = "") -> Report:
    rep = Report("live")
    eng = engine_of(url)
    if gate_from and eng.name != "llama.cpp":  # the record's gate was llama-server's; this server drafts ungated
        p_min, gate_from = 0.0, ""
    if p_min and (eng.name != "llama.cpp" or offline is not None):
        raise EaglewireError(f"--p-min {p_min}: only llama.cpp gates its drafts, and only a prediction that runs the "
                             f"target can gate the same way ({url} is {eng.label()}"
                             + (", checked offline)" if offline is not None else ")"))
    gate = f"; gate --spec-draft-p-min {p_min:g} as {gate_from} records (--p-min overrides)" if gate_from else ""
    rep.add("engine", True, f"{eng.label()} at {url}{gate}" + "".join(f"; assumed: {a}" for a in eng.assumptions()))
    try:
        served, depth = served_acceptance(url, prompts, max_new_tokens, target, eng, prog)
    except ImpossibleCounters as e:  # nothing measured here can be compared: the server, not the wiring, is at fault
        rep.add("server counters", False, str(e), f"the server's speculative-decoding counters are impossible: a "
                f"fault of {eng.label()} (or of a proxy in front of it), not of the drafter's wiring; nothing was "
                "compared: fix or restart the server, then rerun doctor live")
        rep.data.update(served=e.served.to_dict(), engine=eng.label(), prompts=len(prompts))
        return rep
    if depth == 0 or served.drafts == 0:
        rep.checks.append(_no_drafts(url, eng, engine, prompts, max_new_tokens, p_min))
        return rep
    prog.step("computing eaglewire's prediction")
    predicted = (offline(depth) if offline is not None
                 else predicted_acceptance(engine, prompts, depth, max_new_tokens, p_min, prog))
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
    method = getattr(engine, "method", "eagle3")  # DFlashPrediction says "dflash"
    how = {"llama.cpp": f"start llama-server with --metrics, -md DRAFTER.gguf --spec-type draft-{method}",
           "sglang": f"start SGLang with --speculative-algorithm {method.upper()} --speculative-draft-model-path "
                     "DRAFTER --speculative-eagle-topk 1"}.get(eng.name, f"start vLLM with --speculative-config "
                                                                         f"(method {method}) naming the exported drafter")
    return Check("speculation", False, f"{url} reports no speculative drafts for {n} prompts", how)


def static_check_for(export_dir: Path | None, trained: list[str], num_layers: int, arch: str | None):
    """A `static_check` running `doctor config` on the directory the server loaded, when it is known."""
    if export_dir is None:
        return None

    def run(eng: Engine) -> Report | None:
        return doctor_config(export_dir, Engine(eng.name, eng.version, arch), num_layers, trained, None, None,
                             trained_model_config(Path(export_dir)))

    return run
