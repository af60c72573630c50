"""SGLang's launch command for an EAGLE-3 drafter: eaglewire prints it (SGLang runs on CUDA, not here).

The flag names are SGLang's own (`sglang/srt/server_args.py`, checked against the
pinned wheel's source by the tests). A chain of `depth` drafts is `topk` 1 with
`depth` steps and `depth + 1` tokens per verify (the root included).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from eaglewire.infra.errors import EaglewireError


def launch_command(target: str, drafter_dir: Path | str, steps: int, topk: int = 1, draft_tokens: int = 0,
                   host: str = "127.0.0.1", port: int = 30000, tp: int = 1) -> list[str]:
    """`python -m sglang.launch_server ...` serving `target` with the exported drafter at `drafter_dir`: the one
    place its flags are written (`serve --print-command` and the demo report's suggestion both call it).
    A chain (topk 1, as here by default) is what `doctor live` can check; `tp` > 1 adds --tp-size."""
    return ["python", "-m", "sglang.launch_server", "--model-path", str(target), "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(drafter_dir), "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens or steps + 1),
            *(["--tp-size", str(tp)] if tp > 1 else []), "--host", host, "--port", str(port)]


def launch_line(*args, **kwargs) -> str:
    return shlex.join(launch_command(*args, **kwargs))


# What `doctor live` reads from a running SGLang server (0.5.23: `sglang/srt/entrypoints/http_server.py`,
# `managers/tokenizer_manager.py`, `arg_groups/fields/spec.py`; a test checks each name against the pinned wheel).
# SGLang has no /version: /server_info (older: /get_server_info) answers its resolved launch settings.
SERVER_INFO_ROUTES = ("/server_info", "/get_server_info")
GENERATE_ROUTE = "/generate"
SPEC_SETTINGS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                 "speculative_num_draft_tokens", "speculative_draft_model_path")
# Per request, in the reply's meta_info once a round verified: rounds verified, tokens answered, drafts accepted,
# and rounds per number of drafts accepted (index k: rounds that accepted k drafts, the bonus token not counted).
META_FIELDS = ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53


def spec_settings(url: str, info: dict) -> dict:
    """The speculative settings of a /server_info reply, each checked to be what SGLang reports (None: unset)."""
    out = {k: info.get(k) for k in SPEC_SETTINGS}
    algo = out["speculative_algorithm"]
    if algo is not None and not (isinstance(algo, str) and len(algo) <= 64):
        raise EaglewireError(f"{url}{SERVER_INFO_ROUTES[0]}: expected `speculative_algorithm` to be a short string "
                             f"or null, got {str(algo)[:40]!r}")
    for k in SPEC_SETTINGS[1:4]:
        if out[k] is not None and not (_is_count(out[k]) and out[k] <= 256):
            raise EaglewireError(f"{url}{SERVER_INFO_ROUTES[0]}: expected `{k}` to be an integer in 0..256 or null, "
                                 f"got {str(out[k])[:40]!r}")
    return out


def generate_body(prompt_ids: list[int], max_new_tokens: int) -> dict:
    """Greedy, token ids in and out, no stop on special tokens skipped: what eaglewire's engine is asked too."""
    return {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                         "skip_special_tokens": False}}


def read_generate(url: str, reply) -> tuple[list[int], dict]:
    """(output_ids, meta_info) of a /generate reply, each of the shape SGLang gives, or a one-line error."""
    where = f"{url}{GENERATE_ROUTE}"
    if not isinstance(reply, dict):
        raise EaglewireError(f"{where}: expected a JSON object, got {type(reply).__name__} ({str(reply)[:60]})")
    ids, meta = reply.get("output_ids"), reply.get("meta_info")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise EaglewireError(f"{where}: no list of integer `output_ids` in the answer (SGLang returns them for "
                             "`input_ids` requests)")
    if not isinstance(meta, dict):
        raise EaglewireError(f"{where}: no `meta_info` object in the answer")
    for k in META_FIELDS[:3]:
        if k in meta and not _is_count(meta[k]):
            raise EaglewireError(f"{where}: meta_info.{k} = {str(meta[k])[:40]!r} is not a count")
    hist = meta.get(META_FIELDS[3])
    if hist is not None and not (isinstance(hist, list) and len(hist) <= 257 and all(map(_is_count, hist))):
        raise EaglewireError(f"{where}: meta_info.{META_FIELDS[3]} = {str(hist)[:40]!r} is not a list of counts, "
                             "one per number of drafts accepted")
    return ids, meta


def round_counts(meta: dict, n_out: int, depth: int) -> tuple[list[int], str | None]:
    """Rounds per number of drafts accepted (index k: rounds that accepted k), padded to `depth` + 1, from one
    request's meta_info, and why they cannot be what a speculating SGLang counted (None: they can). Each round
    verifies once and commits its accepted drafts plus one token; the first token comes from the prefill."""
    verify = meta.get("spec_verify_ct", 0)
    hist = list(meta.get(META_FIELDS[3]) or [])
    if verify and not hist:
        return [], (f"meta_info reports {verify} verify rounds but no {META_FIELDS[3]} (SGLang 0.5.23 reports how "
                    "many drafts each round accepted): per-position acceptance cannot be read")
    done = meta.get("completion_tokens", n_out)
    over = next((k for k in range(depth + 1, len(hist)) if hist[k]), None)
    correct = sum(k * h for k, h in enumerate(hist))
    if over is not None:
        why = f"{hist[over]} round(s) accepted {over} drafts, but the server drafts {depth} per round"
    elif sum(hist) != verify:
        why = f"{META_FIELDS[3]} counts {sum(hist)} rounds but spec_verify_ct is {verify}"
    elif meta.get("spec_num_correct_drafts", correct) != correct:
        why = f"spec_num_correct_drafts is {meta['spec_num_correct_drafts']} but the histogram sums to {correct}"
    elif done != n_out:
        why = f"completion_tokens is {done} but {n_out} output_ids came back"
    elif verify and (verify > done or done > 1 + verify + correct):
        why = (f"{done} tokens from {verify} verify rounds accepting {correct} drafts (possible only from "
               f"{verify} to {1 + verify + correct})")
    else:
        why = None
    return (hist + [0] * (depth + 1 - len(hist)))[:max(depth + 1, len(hist))], why
