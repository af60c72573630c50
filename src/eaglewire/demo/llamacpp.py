"""The demo's llama.cpp stage: the trained drafter on the CPU engine people run, beside eaglewire's own plain decoding.

Runs only where a llama-server is built (`python -m eaglewire.engines.llama_env`,
~10-25 min once; the demo does not start that build itself). The drafter is
exported with `export --format gguf` (Q8_0) and served on the target as an F32
GGUF, at depth 2 with llama.cpp's draft gate at 0.5 (`--spec-draft-p-min`),
what paid best with llama.cpp on this CPU (docs/results.md). llama.cpp plain,
llama.cpp with the drafter and eaglewire plain each take every bench prompt in
turn, so the ratios come from one run. Acceptance is llama.cpp's own
`--metrics` count, as vLLM counts it, beside eaglewire's prediction of it
(the same prompts through our engine, gated by llama.cpp's rule): equal when
the wiring is right, up to the Q8_0 drafter's rounding.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

from eaglewire.data.heldout import heldout_prompts_path
from eaglewire.decoding.compat import load_drafter_for
from eaglewire.decoding.engine import SpecConfig, SpecEngine
from eaglewire.decoding.run import encode_prompt_file
from eaglewire.doctor.live import Acceptance, predicted_acceptance
from eaglewire.engines import llama_env
from eaglewire.engines.llama_server import DEFAULT_P_MIN, LlamaServer, LlamaSpec, complete
from eaglewire.engines.vllm_server import counter_delta, free_port, spec_counters
from eaglewire.export import gguf
from eaglewire.export.config import ExportConfig
from eaglewire.export.exporter import run_export
from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.checkpoint import load_checkpoint
from eaglewire.saved.depth import LLAMA_CPP_DEPTH
from eaglewire.targets.load import load_target

DRAFTER_TYPE, P_MIN = "q8_0", DEFAULT_P_MIN  # with LLAMA_CPP_DEPTH: what paid best here (see there)


NOT_BUILT = ("no llama-server built here: `python -m eaglewire.engines.llama_env` builds it once (~10-25 min), "
             "then rerun `eaglewire demo` (finished stages are kept)")


def llamacpp_refusal(run: Path) -> str | None:
    """Why llama.cpp cannot serve this run's drafter on its target (its graph, the drafter's points or layout),
    from the export's own checks, which need no llama-server: None when it can."""
    model, prov = load_checkpoint(run / "train" / "drafter")
    why = gguf.refusals(model.config, prov.points, prov.num_layers, prov.fingerprint.arch)
    return "; ".join(why) or None


def llamacpp_stage(run: Path, target: str, n_prompts: int, max_new_tokens: int, threads: int = 2) -> dict:
    """{"skipped": why} where it cannot run, else speeds, ratios and served acceptance."""
    if refusal := llamacpp_refusal(run):
        return {"skipped": f"llama.cpp cannot take this target or drafter: {refusal}", "refused": refusal}
    if not llama_env.is_built():
        return {"skipped": NOT_BUILT}
    try:
        exp = run_export(ExportConfig(ckpt=run / "train" / "drafter", format="gguf", out=run / "export" / "llama.cpp",
                                      gguf_type=DRAFTER_TYPE, verifier=target, force=True))
        tg = gguf.target_gguf(target, "f32")
    except EaglewireError as e:  # e.g. a tokenizer llama.cpp's converter does not know: the rest of the demo stands
        return {"skipped": f"llama.cpp cannot take this target or drafter: {e}"}
    t = load_target(target)
    drafter, points, _ = load_drafter_for(t, run / "train" / "drafter")
    plain, spec = SpecEngine(t), SpecEngine(t, drafter, points)
    prompts = encode_prompt_file(spec, heldout_prompts_path(), n_prompts)[0]
    binary = llama_env.server_binary()
    specs = {"llama.cpp plain": LlamaSpec(tg, None, port=free_port(), threads=threads),
             "llama.cpp + drafter": LlamaSpec(tg, Path(exp["out"]) / "drafter.gguf", depth=LLAMA_CPP_DEPTH, port=free_port(),
                                              threads=threads, p_min=P_MIN)}
    with ExitStack() as stack:
        urls = {n: stack.enter_context(LlamaServer(binary, s, run / "export" / f"{n.replace(' ', '_')}.log")
                                       .start(timeout=300)).spec.url for n, s in specs.items()}
        before = spec_counters(urls["llama.cpp + drafter"])
        secs, toks, outs = _interleaved(urls, plain, prompts, max_new_tokens)
        delta = counter_delta(spec_counters(urls["llama.cpp + drafter"]), before)
    tps = {n: toks[n] / secs[n] for n in secs}
    served = Acceptance(delta["drafts"], list(delta["accepted_per_pos"]))
    predicted = predicted_acceptance(spec, prompts, LLAMA_CPP_DEPTH, max_new_tokens, P_MIN)
    return {"depth": LLAMA_CPP_DEPTH, "p_min": P_MIN, "drafter_type": DRAFTER_TYPE, "target_gguf": str(tg), "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "tokens_per_s": tps,
            "speedup_vs_llama_plain": tps["llama.cpp + drafter"] / tps["llama.cpp plain"],
            "eaglewire_plain_vs_llama_plain": tps["eaglewire plain"] / tps["llama.cpp plain"],
            "mean_acceptance_length": served.mean_length,
            "predicted_mean_acceptance_length": predicted.mean_length, "predicted_rounds": predicted.drafts,
            "rounds": served.drafts, "outputs_equal_plain": sum(a == b for a, b in zip(outs["llama.cpp + drafter"],
                                                                                  outs["llama.cpp plain"])),
            "export": exp["out"], "ids": exp["ids"]}


def _interleaved(urls: dict, plain: SpecEngine, prompts: list[list[int]], max_new: int):
    """Every method on every prompt in turn (order rotating), so drift of a shared machine hits all alike."""
    calls = {n: (lambda ids, u=u: complete(u, ids, max_new)[0]) for n, u in urls.items()}
    calls["eaglewire plain"] = lambda ids: plain.generate(ids, SpecConfig(mode="plain", max_new_tokens=max_new)).token_ids
    names = list(calls)
    for n in names:  # warm-up, untimed
        calls[n](prompts[0][:8])
    secs, toks, outs = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0), {n: [] for n in names}
    for i, ids in enumerate(prompts):
        for n in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            out = calls[n](ids)
            secs[n] += time.perf_counter() - t0
            toks[n] += len(out)
            outs[n].append(out)
    return secs, toks, outs
