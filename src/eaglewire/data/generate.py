"""Regenerate assistant answers with the target itself.

EAGLE-3 trains on the target's own outputs: the drafter learns to predict
what *this* target says, not what a dataset's author wrote. Generation is
batched (left padding + attention mask: 10x+ the throughput of batch 1 on
CPU) and resumable: finished samples are appended to `responses.jsonl` one
batch at a time, and a restart skips them.
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from eaglewire.data.config import GenSettings
from eaglewire.data.gencapture import GenCapture, Recording
from eaglewire.data.jsonl import ANSWER_IDS, JsonlAppender, index_problem, read_jsonl, rewrite_jsonl
from eaglewire.data.prompts import prompt_turns
from eaglewire.targets.chat import apply_chat_template
from eaglewire.targets.fastlinear import packed_linears
from eaglewire.targets.kvcache import growing_cache


@dataclass
class GenStats:
    done: int = 0
    skipped_empty: int = 0
    skipped_long: int = 0
    resumed: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    finish: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Bounded in time and size (targets/chat.py): the template is code from the model's directory."""
    return apply_chat_template(tokenizer, messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, T - len(s):] = torch.tensor(s)
        mask[b, T - len(s):] = 1
    return ids, mask  # [B, T], [B, T]


@torch.no_grad()
def generate_batch(target, prompts: list[list[int]], s: GenSettings, seed: int,
                   capture: GenCapture | None = None, rec: Recording | None = None) -> list[tuple[list[int], str]]:
    """Returns (new token ids without padding, finish reason) per prompt; with `capture`, `rec` keeps
    the points' outputs of every forward (data/gencapture.py)."""
    tok, model = target.tokenizer, target.model
    ids, mask = left_pad(prompts, tok.pad_token_id)
    ids, mask = ids.to(target.device), mask.to(target.device)
    torch.manual_seed(seed)
    sample = s.temperature > 0
    cache = growing_cache(model.config)
    if rec is not None:
        rec.ids, rec.mask, rec.cache = ids, mask, cache
    # Prepacked linears and an in-place KV cache (side-by-side figure: benchmarks/README.md).
    with packed_linears(model), (capture.recording(model, rec) if capture is not None else nullcontext()):
        out = model.generate(
            input_ids=ids, attention_mask=mask,
            cache=cache,
            max_new_tokens=s.max_new_tokens, do_sample=sample,
            temperature=s.temperature if sample else None, top_p=s.top_p if sample else None, top_k=None,
            eos_token_id=target.eos_ids(), pad_token_id=tok.pad_token_id,
        )
    if rec is not None:
        rec.n_new = out.shape[1] - ids.shape[1]
    eos = set(target.eos_ids())
    res = []
    for row in out[:, ids.shape[1]:].tolist():
        new = []
        reason = "length"
        for t in row:
            new.append(t)
            if t in eos:
                reason = "eos"
                break
        res.append((new, reason))
    return res


def _pending(convs, done_idx: set[int], tokenizer, s: GenSettings, stats: GenStats, share=(0, 1)):
    """What is left to ask, as (index, messages, prompt ids); `share` = (rank, world) takes every world-th."""
    todo = []
    for i, c in enumerate(convs):
        if i in done_idx or i % share[1] != share[0]:
            continue
        msgs = prompt_turns(c)
        ids = encode_prompt(tokenizer, msgs)
        if len(ids) > s.max_prompt_tokens:
            stats.skipped_long += 1
            continue
        todo.append((i, msgs, ids))
    todo.sort(key=lambda x: len(x[2]))  # similar lengths per batch: less padding
    return todo


def pending_answers(convs, out_path: Path, tokenizer, s: GenSettings, stats: GenStats, resume: bool,
                    share=(0, 1)) -> list:
    """Open `out_path` for appending (resumed: kept minus a partial tail line; else emptied) and
    return what is left to ask. Shared by in-process and server generation."""
    rows = read_jsonl(out_path, check=index_problem) if resume else []
    if resume:
        cut = out_path.is_file() and not out_path.read_bytes().endswith(b"\n") and out_path.stat().st_size > 0
        if cut and len(rows) < sum(1 for ln in out_path.read_bytes().split(b"\n") if ln.strip()):
            print(f"[generate] {out_path}: its last line was cut (a killed run); that prompt is answered again",
                  file=sys.stderr, flush=True)
        rewrite_jsonl(out_path, rows)  # drop a partial tail line left by a killed run
    elif out_path.exists():
        out_path.unlink()
    done_idx = {r["index"] for r in rows}
    stats.resumed = len(done_idx)
    return _pending(convs, done_idx, tokenizer, s, stats, share)


def generate_responses(target, convs, out_path: Path, s: GenSettings, resume: bool = False,
                       share: tuple[int, int] = (0, 1), capture: GenCapture | None = None) -> GenStats:
    """Write `responses.jsonl` rows {index, messages (with the target's answer as text), answer_ids, ...};
    with `capture`, also each batch's features for extraction (data/gencapture.py)."""
    stats = GenStats()
    todo = pending_answers(convs, out_path, target.tokenizer, s, stats, resume, share)
    writer = JsonlAppender(out_path)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), desc="generate", unit="sample", dynamic_ncols=True)
    try:
        for b in range(0, len(todo), s.batch_size):
            chunk = todo[b: b + s.batch_size]
            rec = Recording() if capture is not None else None
            outs = generate_batch(target, [c[2] for c in chunk], s, seed=s.seed * 100003 + chunk[0][0],
                                  capture=capture, rec=rec)
            kept: list[dict | None] = [None] * len(chunk)  # the rows written, in batch order
            for j, ((i, msgs, pids), (new, reason)) in enumerate(zip(chunk, outs)):
                stats.new_tokens += len(new)
                text = target.tokenizer.decode(new, skip_special_tokens=True).strip()
                if not text:
                    stats.skipped_empty += 1
                    writer.write({"index": i, "skipped": "empty"})
                    continue
                stats.finish[reason] = stats.finish.get(reason, 0) + 1
                stats.done += 1
                # the ids are what training reads (the text, decoded, may not tokenise back to them)
                row = {"index": i, "messages": msgs + [{"role": "assistant", "content": text}],
                       ANSWER_IDS: new, "prompt_tokens": len(pids), "response_tokens": len(new), "finish": reason}
                writer.write(row)
                kept[j] = row
            if capture is not None:
                capture.write(capture.complete(rec, kept))
            writer.flush()
            stats.seconds = time.perf_counter() - t0
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{stats.tokens_per_s:.0f}")
    finally:
        writer.close()
        bar.close()
    stats.seconds = time.perf_counter() - t0
    return stats
