"""Data-stage benchmark: extraction vs bare forward, batched vs batch-1 generation, and `data build` with the
features kept while generating vs a second forward (--gencapture-prompts N).

Measured side by side in one process on the same batches; prints a table and,
with --json, a JSON result. Usage:
    python benchmarks/bench_data.py [--target default] [--samples 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from eaglewire.data.extract import (
    ExtractSettings,
    _batches,
    extract,
    forward_features,
    tokenize_rows,
)
from eaglewire.data.generate import GenSettings, encode_prompt, generate_batch
from eaglewire.targets.load import load_target
from eaglewire.targets.points import eagle3_default

PROMPTS = ["Explain how rainbows form.", "Write a haiku about autumn.", "What is the capital of Japan?",
           "Give me a recipe for pancakes.", "How do vaccines work?", "Describe a cat to someone who has never seen one.",
           "Why do we have seasons?", "Write a limerick about a programmer."]


def _rows(n: int) -> list[dict]:
    txt = ("Sure! Here is a detailed answer that goes on for a while so that the sequence has a realistic length. " * 6).strip()
    return [{"index": i, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" ({i})"},
                                      {"role": "assistant", "content": txt}]} for i in range(n)]


@torch.no_grad()
def bench_extract(t, n: int) -> dict:
    pts = [p.name for p in eagle3_default(t.num_layers)]
    rows = _rows(n)
    s = ExtractSettings(points=pts, dtype="bf16", batch_tokens=4096)
    items, _ = tokenize_rows(t.tokenizer, rows, 2048)
    batches = list(_batches(items, s.batch_tokens))
    ntok = sum(len(i[1]) for i in items)
    t0 = time.perf_counter()
    for b in batches:  # bare forward: full model with lm_head, same padded batches
        T = max(len(x[1]) for x in b)
        ids = torch.full((len(b), T), t.tokenizer.pad_token_id)
        att = torch.zeros((len(b), T), dtype=torch.long)
        for j, x in enumerate(b):
            ids[j, : len(x[1])] = torch.tensor(x[1])
            att[j, : len(x[1])] = 1
        t.model(input_ids=ids, attention_mask=att, use_cache=False)
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b in batches:
        forward_features(t, b, [__import__("eaglewire.targets.points", fromlist=["Point"]).Point.parse(p) for p in pts])
    capture_only = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        extract(t, rows, Path(d), s, gen={})
        full = time.perf_counter() - t0
    return {"tokens": ntok, "bare_forward_tok_s": ntok / bare, "capture_tok_s": ntok / capture_only,
            "extract_end_to_end_tok_s": ntok / full, "ratio_extract_vs_bare": bare / full,
            "ratio_capture_vs_bare": bare / capture_only}


def bench_generate(t, n: int, max_new: int, batch: int) -> dict:
    prompts = [encode_prompt(t.tokenizer, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(n)]
    s = GenSettings(max_new_tokens=max_new, temperature=0.0)
    res = {}
    for bs in (1, batch):
        toks, t0 = 0, time.perf_counter()
        for i in range(0, n, bs):
            for new, _ in generate_batch(t, prompts[i:i + bs], s, seed=0):
                toks += len(new)
        res[f"batch_{bs}_tok_s"] = toks / (time.perf_counter() - t0)
    res["ratio_batched_vs_1"] = res[f"batch_{batch}_tok_s"] / res["batch_1_tok_s"]
    return res


def bench_generate_kernels(t, n: int, max_new: int, batch: int, rounds: int = 2) -> dict:
    """Plain transformers ``generate`` vs ours (prepacked linears + in-place KV cache), same batches, interleaved."""
    from eaglewire.data.generate import left_pad

    prompts = [encode_prompt(t.tokenizer, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" ({i})"}])
               for i in range(n)]
    s = GenSettings(max_new_tokens=max_new, temperature=0.0)
    secs = {"transformers": 0.0, "eaglewire": 0.0}
    for _ in range(rounds):
        for i in range(0, n, batch):
            chunk = prompts[i:i + batch]
            ids, mask = left_pad(chunk, t.tokenizer.pad_token_id)
            t0 = time.perf_counter()
            t.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=t.eos_ids(), pad_token_id=t.tokenizer.pad_token_id)
            t1 = time.perf_counter()
            generate_batch(t, chunk, s, seed=0)
            secs["transformers"] += t1 - t0
            secs["eaglewire"] += time.perf_counter() - t1
    return {"batch": batch, "prompts": n, "max_new_tokens": max_new, "seconds": secs,
            "ratio_eaglewire_vs_transformers": secs["transformers"] / secs["eaglewire"]}


def bench_gencapture(n: int, max_new: int, batch: int, target: str) -> dict:
    """Whole `data build` runs, features kept while generating (on) or by extraction's forward (off), ABBA order."""
    from eaglewire.data.config import DataBuildConfig
    from eaglewire.data.pipeline import run_build

    secs: dict[str, list] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})"}) + "\n"
                                   for i in range(n)))
        for k, mode in enumerate(("on", "off", "off", "on")):
            t0 = time.perf_counter()
            res = run_build(DataBuildConfig(out=Path(tmp) / f"ds{k}", target=target, prompts=prompts,
                                            max_new_tokens=max_new, batch_size=batch, device="cpu",
                                            gen_capture=mode == "on"))
            secs[mode].append({"seconds": time.perf_counter() - t0, "extract_seconds": res["extract"]["seconds"],
                               "tokens": res["extract"]["num_tokens"], "new_tokens": res["generate"]["new_tokens"]})
    tot = {m: sum(r["seconds"] for r in v) for m, v in secs.items()}
    return {"prompts": n, "max_new_tokens": max_new, "batch": batch, "runs": secs,
            "answer_tokens_per_min": {m: 60 * sum(r["new_tokens"] for r in secs[m]) / tot[m] for m in tot},
            "ratio_on_vs_off": tot["off"] / tot["on"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="default")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--gen-prompts", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kernels-batch", type=int, default=64, help="batch for the generate-kernels comparison (0 = skip)")
    ap.add_argument("--gencapture-prompts", type=int, default=0,
                    help="prompts per `data build` for the features-while-generating comparison (0 = skip)")
    ap.add_argument("--gencapture-only", action="store_true", help="run only that comparison")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.gencapture_only:
        out = {"target": a.target, "threads": torch.get_num_threads(),
               "gencapture": bench_gencapture(a.gencapture_prompts or 64, 128, 64, a.target)}
        _print_gencapture(out["gencapture"]) if not a.json else print(json.dumps(out, indent=2))
        return
    t = load_target(a.target)
    out = {"target": a.target, "threads": torch.get_num_threads(), "extract": bench_extract(t, a.samples),
           "generate": bench_generate(t, a.gen_prompts, a.gen_tokens, a.batch)}
    if a.kernels_batch:
        out["generate_kernels"] = bench_generate_kernels(t, a.kernels_batch, 96, a.kernels_batch)
    if a.gencapture_prompts:
        out["gencapture"] = bench_gencapture(a.gencapture_prompts, 128, 64, a.target)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    e, g = out["extract"], out["generate"]
    print(f"extraction ({e['tokens']} tokens): bare forward {e['bare_forward_tok_s']:.0f} tok/s, capture {e['capture_tok_s']:.0f} tok/s, "
          f"end-to-end extract {e['extract_end_to_end_tok_s']:.0f} tok/s -> ratio {e['ratio_extract_vs_bare']:.2f} (goal >= 0.85)")
    print(f"generation: batch 1 {g['batch_1_tok_s']:.1f} tok/s, batch {a.batch} {g[f'batch_{a.batch}_tok_s']:.1f} tok/s "
          f"-> {g['ratio_batched_vs_1']:.1f}x")
    if "generate_kernels" in out:
        k = out["generate_kernels"]
        print(f"generation kernels at batch {k['batch']}: transformers generate {k['seconds']['transformers']:.1f} s, "
              f"eaglewire (prepacked linears + in-place KV cache) {k['seconds']['eaglewire']:.1f} s "
              f"-> {k['ratio_eaglewire_vs_transformers']:.2f}x")
    if "gencapture" in out:
        _print_gencapture(out["gencapture"])


def _print_gencapture(g: dict) -> None:
    on, off = (sum(r["seconds"] for r in g["runs"][m]) for m in ("on", "off"))
    ex = sum(r["extract_seconds"] for r in g["runs"]["off"])
    print(f"data build, {g['prompts']} prompts x {g['max_new_tokens']} tokens, twice each (ABBA): features kept while "
          f"generating {on:.0f} s, a second forward {off:.0f} s (its extraction {ex:.0f} s) -> {g['ratio_on_vs_off']:.2f}x; "
          f"answer tokens per minute {g['answer_tokens_per_min']['on']:.0f} vs {g['answer_tokens_per_min']['off']:.0f}")


if __name__ == "__main__":
    main()
