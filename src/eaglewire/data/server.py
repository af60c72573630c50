"""Regenerate answers through an OpenAI-compatible server (vLLM, SGLang, `transformers serve`, llama.cpp).

Why: a target worth a drafter rarely fits in this process. Users already serve
it with an engine on a GPU node, so answers come from that engine's
`/v1/chat/completions` and only extraction (or online training) runs the
target here. The local path's contract holds: rows are keyed by prompt
index and appended as they finish, so a rerun with ``--resume`` asks only
for what is missing; a request that fails after its retries is recorded in
``failures.jsonl`` and never written as an answer; the server's identity,
the sampling settings, how reasoning was handled and whether the server's
chat template tokenises prompts as ours does are recorded in the provenance.

Only the standard library talks HTTP, so a dataset machine needs no client
package.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from eaglewire.data.config import GenSettings
from eaglewire.data.generate import GenStats, pending_answers
from eaglewire.data.jsonl import ANSWER_IDS, JsonlAppender, rewrite_jsonl
from eaglewire.engines.http import ChatClient, RequestFailed
from eaglewire.infra.errors import EaglewireError
from eaglewire.targets.chat import apply_chat_template

FAILURES = "failures.jsonl"
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_PROBE = "EAGLEWIRE_REASONING_PROBE"


@dataclass
class ServerSettings:
    url: str
    model: str | None = None
    concurrency: int = 8
    reasoning: str = "keep"
    retries: int = 4
    timeout_s: float = 600.0
    backoff_s: float = 1.0
    token_ids: bool = False  # ask for the generated ids (vLLM's return_token_ids); other servers may refuse the field


def is_vllm(ident: dict) -> bool:
    """Whether the server that `ChatClient.identity` described is vLLM: it answers /version with its version,
    SGLang answers /get_server_info as well, `transformers serve` and llama.cpp answer neither."""
    v = ident.get("version")
    return isinstance(v, dict) and isinstance(v.get("version"), str) and "get_server_info" not in ident


def _text_content(msg: dict) -> str | None:
    """The reply's text: a string, or the OpenAI list of parts joined; None when it is neither."""
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(str(p.get("text", "")) for p in content if p.get("type", "text") == "text")
    return None


def _split_reasoning(msg: dict) -> tuple[str, str | None]:
    """(answer, reasoning) whether the server parsed reasoning out or left `<think>` inline."""
    content = _text_content(msg) or ""
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning is None:
        m = _THINK.match(content)
        if m:
            reasoning, content = m.group(1).strip(), content[m.end():]
    return content.strip(), reasoning


def template_renders_reasoning(tokenizer) -> bool:
    """Whether the chat template writes an assistant's `reasoning_content` (Qwen3 style) or drops it."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}]
    try:
        return _PROBE in apply_chat_template(tokenizer, msgs, tokenize=False)
    except EaglewireError:
        raise  # a template that loops or balloons: named by the bound, not read as "no reasoning"
    except Exception:  # a template that rejects the extra key cannot render it  # noqa: BLE001
        return False


def assistant_message(msg: dict, mode: str, template_has_reasoning: bool) -> tuple[dict, bool]:
    """The assistant turn to store, and whether it carried reasoning.

    `keep` trains the drafter on the thinking the target produces (it drafts
    those tokens when serving too): in the template's own field when the
    template renders one, else inline as `<think>...</think>`. `strip` drops it.
    """
    content, reasoning = _split_reasoning(msg)
    out = {"role": "assistant", "content": content}
    if reasoning and mode == "keep":
        if template_has_reasoning:
            out["reasoning_content"] = reasoning
        else:
            out["content"] = f"<think>\n{reasoning}\n</think>\n\n{content}"
    return out, bool(reasoning)


def _body(model: str, msgs: list[dict], s: GenSettings, seed: int, token_ids: bool = False) -> dict:
    # return_token_ids: vLLM (>= 0.10.2) then answers with the ids it generated, which training reads
    # (engines/vllm_server.py complete_ids asks the same); sent to vLLM only (`transformers serve` refuses
    # unknown fields), other servers' text is tokenised at extract
    body = {"model": model, "messages": msgs, "max_tokens": s.max_new_tokens, "temperature": s.temperature}
    if token_ids:
        body["return_token_ids"] = True
    if s.temperature > 0:
        body.update(top_p=s.top_p, seed=seed)
    return body


@dataclass
class _Answer:
    index: int
    row: dict | None = None
    error: str | None = None


def _ask(client: ChatClient, model: str, item, s: GenSettings, ss: ServerSettings, with_reasoning: bool,
         tokenizer) -> _Answer:
    i, msgs, pids = item
    try:
        data, _ = client.request("/v1/chat/completions", _body(model, msgs, s, s.seed * 100003 + i, ss.token_ids))
        choice = data["choices"][0]
        msg, finish = choice["message"], choice.get("finish_reason")
    except RequestFailed as e:
        return _Answer(i, error=str(e))
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        return _Answer(i, error=f"reply without choices[0].message ({e!r})")
    if finish not in ("stop", "length", "eos"):
        # A cut-off or filtered reply is not an answer the target finished.
        return _Answer(i, error=f"finish_reason {finish!r} (expected stop or length)")
    why = _malformed(msg, data, s.max_new_tokens)
    if why:
        return _Answer(i, error=why)
    turn, had_reasoning = assistant_message(msg, ss.reasoning, with_reasoning)
    usage = data.get("usage") or {}
    n_new = usage.get("completion_tokens")
    if not isinstance(n_new, int):  # llama.cpp and others may omit usage: count with our tokenizer
        n_new = len(tokenizer(turn["content"], add_special_tokens=False)["input_ids"])
    if n_new > s.max_new_tokens + _SLACK_TOKENS:
        return _Answer(i, error=f"{n_new} answer tokens for a max_tokens {s.max_new_tokens} request")
    row = {"index": i, "messages": msgs + [turn], "prompt_tokens": len(pids), "response_tokens": n_new, "finish": "eos" if finish != "length" else "length",
           "server_prompt_tokens": usage.get("prompt_tokens"), "reasoning": had_reasoning}
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if ids is not None and not had_reasoning:  # reasoning split off: the ids no longer match the stored turn
        row[ANSWER_IDS] = ids
    return _Answer(i, row=row)


_SLACK_TOKENS = 8  # servers count a stop token or two differently from us


def _malformed(msg, data: dict, max_new: int) -> str | None:
    """Why a 200 reply cannot be stored as an answer (None when it can)."""
    if not isinstance(msg, dict):
        return f"choices[0].message is {type(msg).__name__}, not an object"
    if "content" not in msg and not (msg.get("reasoning_content") or msg.get("reasoning")):
        return "reply without message.content (asked again on --resume)"
    text = _text_content(msg)
    if text is None:
        return f"message.content is {type(msg['content']).__name__}, not text"
    if len(text) > 64 * (max_new + _SLACK_TOKENS):  # no tokenizer makes 64 characters one token
        return f"an answer of {len(text)} characters for a max_tokens {max_new} request"
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return f"usage is {type(usage).__name__}, not an object"
    n = (usage or {}).get("completion_tokens")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        return f"usage.completion_tokens {n!r} is not a token count"
    ids = ((data.get("choices") or [{}])[0] or {}).get("token_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) > max_new + _SLACK_TOKENS
                            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31 for t in ids)):
        return f"choices[0].token_ids {ids!r:.60} is not a list of at most {max_new + _SLACK_TOKENS} token ids"
    return None


@dataclass
class ServerStats:
    failed: int = 0
    with_reasoning: int = 0
    prompt_tokens_checked: int = 0
    prompt_tokens_mismatched: int = 0
    with_ids: int = 0  # answers stored with the ids the server generated (the rest: text, tokenised at extract)


def _record(ans: _Answer, writer, stats, sstats: ServerStats, failures: list) -> None:
    if ans.error is not None:
        sstats.failed += 1
        failures.append({"index": ans.index, "error": ans.error})
        return
    row = ans.row
    spt = row.pop("server_prompt_tokens")
    if spt is not None:
        sstats.prompt_tokens_checked += 1
        sstats.prompt_tokens_mismatched += int(spt != row["prompt_tokens"])
    sstats.with_reasoning += int(row["reasoning"])
    sstats.with_ids += int(ANSWER_IDS in row)
    if not row["messages"][-1]["content"] and not row["messages"][-1].get("reasoning_content"):
        stats.skipped_empty += 1
        writer.write({"index": row["index"], "skipped": "empty"})
        return
    stats.done += 1
    stats.new_tokens += row["response_tokens"]
    stats.finish[row["finish"]] = stats.finish.get(row["finish"], 0) + 1
    writer.write(row)
    writer.flush()


def generate_via_server(client: ChatClient, model: str, tokenizer, convs, out_path: Path, s: GenSettings,
                        ss: ServerSettings, resume: bool = False, share: tuple[int, int] = (0, 1)):
    """Like `generate_responses`, with `concurrency` requests in flight. Returns (GenStats, ServerStats)."""
    stats, sstats = GenStats(), ServerStats()
    todo = pending_answers(convs, out_path, tokenizer, s, stats, resume, share)
    with_reasoning = template_renders_reasoning(tokenizer)
    failures: list[dict] = []
    writer = JsonlAppender(out_path)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"generate via {client.base}", unit="sample", dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=ss.concurrency)
    try:
        futs = [pool.submit(_ask, client, model, item, s, ss, with_reasoning, tokenizer) for item in todo]
        for fut in as_completed(futs):
            _record(fut.result(), writer, stats, sstats, failures)
            stats.seconds = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(tok_s=f"{stats.tokens_per_s:.0f}", failed=sstats.failed)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        writer.close()
        bar.close()
        name = FAILURES if share[1] == 1 else f"failures.rank{share[0]}.jsonl"  # merged by rank 0
        rewrite_jsonl(out_path.parent / name, sorted(failures, key=lambda f: f["index"]))
    stats.seconds = time.perf_counter() - t0
    return stats, sstats, with_reasoning
