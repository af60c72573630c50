"""Answers per second through an OpenAI-compatible server vs in process, at equal concurrency.

`data generate --server` sends `--concurrency` requests at once; the in-process
path runs batches of the same size. Both answer the same prompts greedily
with the same target, rounds interleaved (in-process, then each server mode)
so machine noise falls on all alike. The server is `transformers serve`,
plain and with its continuous batching; vLLM or SGLang on a GPU are what
users would point `--server` at, and are not measured here.

    python benchmarks/bench_server.py --target default --prompts 16 --max-new-tokens 64 --concurrency 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from eaglewire.data.config import GenSettings  # noqa: E402
from eaglewire.data.generate import generate_responses  # noqa: E402
from eaglewire.data.server import ServerSettings, generate_via_server  # noqa: E402
from eaglewire.data.topic_prompts import topic_prompts  # noqa: E402
from eaglewire.engines.http import ChatClient  # noqa: E402
from eaglewire.targets.load import load_target, resolve_target_dir  # noqa: E402
from eaglewire_testing.serve import transformers_server  # noqa: E402

MODES = {"serve": [], "serve --continuous-batching": ["--continuous-batching"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each side (the machine's cores)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    convs = topic_prompts(a.prompts, seed=7)
    s = GenSettings(max_new_tokens=a.max_new_tokens, batch_size=a.concurrency)
    tok_s: dict[str, list[float]] = {"in-process": [], **{m: [] for m in MODES}}
    tmp = Path(tempfile.mkdtemp(prefix="bench_server-"))
    with ExitStack() as stack:
        urls = {m: stack.enter_context(transformers_server(resolve_target_dir(a.target), tmp / f"{i}.log", extra,
                                                           threads=a.threads))
                for i, (m, extra) in enumerate(MODES.items())}
        for r in range(a.rounds):
            st = generate_responses(target, convs, tmp / f"local{r}.jsonl", s)
            tok_s["in-process"].append(st.tokens_per_s)
            for m, url in urls.items():
                ss = ServerSettings(url=url, concurrency=a.concurrency)
                client = ChatClient(url)
                model = client.identity(None)["model"]
                st, sst, _ = generate_via_server(client, model, target.tokenizer, convs, tmp / f"{m}{r}.jsonl", s, ss)
                tok_s[m].append(st.tokens_per_s if not sst.failed else float("nan"))
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in tok_s.items()), flush=True)
    med = {k: statistics.median(v) for k, v in tok_s.items()}
    res = {"target": a.target, "prompts": a.prompts, "max_new_tokens": a.max_new_tokens,
           "concurrency": a.concurrency, "rounds": a.rounds, "tokens_per_s": tok_s, "median_tokens_per_s": med,
           "ratio_vs_in_process": {k: med[k] / med["in-process"] for k in MODES}}
    for k in MODES:
        print(f"{k:<30} {med[k]:7.1f} tok/s  = {res['ratio_vs_in_process'][k]:.2f}x in-process ({med['in-process']:.1f})")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
