"""The target every parallel-drafter serve test trains on, its greedy answers, and one served start-and-read.

The target is tiny:mistral without its sliding window (vLLM's CPU attention runs its head_dim 32; a window
would test the window, not the wiring): unlike tiny:llama, whose greedy answer repeats one token, its answers
vary enough that a drafter reading the wrong layers drafts other tokens. The prompts are the held-out ones
`serve` checks on, tokenized as it does; the answers are the target's own greedy continuations
(transformers' generate: the independent reference). One builder serves the DFlash (dflash_serving.py) and
P-EAGLE (peagle_serving.py) drafters, so the two are trained on and checked against the same answers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.engine import SpecEngine
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.targets.load import load_target
from eaglewire.targets.tiny import build_tiny

NUM_PROMPTS, MAX_NEW = 8, 48


def greedy(target, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """The target's own greedy continuations (transformers' generate: the independent reference)."""
    out = []
    for p in prompts:
        ids = target.model.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=target.eos_ids())
        out.append(ids[0, len(p):].tolist())
    return out


def check_prompts(target) -> list[list[int]]:
    """The held-out prompts `serve` checks on, tokenized as it does."""
    return encode_prompt_file(SpecEngine(target), heldout_prompts_path(), NUM_PROMPTS)[0]


def batch(target, prompts: list[list[int]], answers: list[list[int]]):
    """(ids, attention mask, loss mask) of prompt + answer rows, right-padded, the loss on the answers."""
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    t, pad = max(map(len, seqs)), target.eos_ids()[0]
    x = torch.tensor([s + [pad] * (t - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs])
    lm = torch.tensor([[0] * len(p) + [1] * len(a) + [0] * (t - len(p) - len(a))
                       for p, a in zip(prompts, answers, strict=True)])
    return x, attn, lm


def build_served_run(root: Path, make: Callable[[Path, object, list, list], dict]) -> dict:
    """{target (dir), loaded, prompts, answers, **make(target_dir, target, prompts, answers)}: `make` trains and
    saves the drafter. One torch thread throughout: tiny matmuls on a loaded 2-core machine run faster so."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target_dir = build_tiny("mistral", Path(root) / "target", sliding_window=None)
        target = load_target(str(target_dir))
        prompts = check_prompts(target)
        answers = greedy(target, prompts, MAX_NEW)
        made = make(target_dir, target, prompts, answers)
    finally:
        torch.set_num_threads(before)
    return {"target": target_dir, "loaded": target, "prompts": prompts, "answers": answers, **made}


def serve_check_only(vllm_python, ckpt: Path, out: Path, monkeypatch, max_model_len: int) -> tuple[dict, dict]:
    """(`eaglewire serve CKPT --check-only` result, the --speculative-config it started vLLM with): the vLLM the
    serve tests can start here (VLLM_TEST_ARGS), NUM_PROMPTS checked prompts of MAX_NEW tokens."""
    import dataclasses  # why: with the imports below, needed only by the real-vLLM tests
    import json  # why: as above
    import shlex  # why: as above

    from eaglewire.engines.vllm_server import free_port  # why: as above
    from eaglewire.serve import serving  # why: as above
    from eaglewire.serve.config import ServeConfig  # why: as above
    from eaglewire_testing.serve import VLLM_TEST_ARGS  # why: as above

    real = serving._spec
    monkeypatch.setattr(serving, "_spec", lambda *a: dataclasses.replace(real(*a), extra=list(VLLM_TEST_ARGS)))
    res = serving.run_serve(ServeConfig(drafter=ckpt, out=out, port=free_port(), vllm_python=str(vllm_python),
                                        max_model_len=max_model_len, check_prompts=NUM_PROMPTS,
                                        max_new_tokens=MAX_NEW, check_only=True, json=True))
    argv = shlex.split(res["command"])
    return res, json.loads(argv[argv.index("--speculative-config") + 1])


def served_answers(vllm_python, spec, log: Path, prompts: list[list[int]]):
    """(served acceptance, depth) of `prompts` on one vLLM started with `spec` (greedy, MAX_NEW tokens each)."""
    from eaglewire.doctor.live import served_acceptance  # why: real-vLLM tests only
    from eaglewire.engines.vllm_server import VllmServer  # why: as above

    with VllmServer(vllm_python, spec, log).start(timeout=600) as srv:
        return served_acceptance(srv.spec.url, prompts, MAX_NEW)
