"""vLLM plain and vLLM + our drafter beside eaglewire's own methods, on the same held-out prompts.

    python benchmarks/bench_vllm.py --drafter runs/demo-quick/train/drafter --json runs/bench_vllm.json

One vLLM server at a time (two would share the 2 cores): vLLM plain, then
eaglewire plain / chain / tree (interleaved per prompt), then vLLM + drafter.
Speeds are tokens per second over the same prompts and token budget; ratios
are against eaglewire's plain decoding and against vLLM plain. Acceptance is
reported as vLLM counts it (mean acceptance length = 1 + accepted per round,
ungated chain of --depth), served next to eaglewire's prediction for the same
prompts. vLLM runs the model on one thread here (it reserves a core).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from eaglewire.data.heldout import heldout_prompts_path  # noqa: E402
from eaglewire.decoding.compat import load_drafter_for  # noqa: E402
from eaglewire.decoding.engine import SpecConfig, SpecEngine  # noqa: E402
from eaglewire.decoding.run import encode_prompt_file  # noqa: E402
from eaglewire.doctor.live import predicted_acceptance, served_acceptance  # noqa: E402
from eaglewire.engines.vllm_env import find_python, vllm_version  # noqa: E402
from eaglewire.engines.vllm_server import (  # noqa: E402
    ServeSpec,
    VllmServer,
    complete_ids,
    free_port,
    served_model,
)
from eaglewire.export.config import ExportConfig  # noqa: E402
from eaglewire.export.exporter import run_export  # noqa: E402
from eaglewire.saved.checkpoint import read_provenance, resolve_dir  # noqa: E402
from eaglewire.targets.load import load_target, resolve_target_dir  # noqa: E402


def _vllm_phase(py, target_dir: Path, drafter: Path | None, depth: int, prompts, max_new: int, log: Path) -> dict:
    spec = ServeSpec(target_dir=target_dir, drafter_dir=drafter, depth=depth, port=free_port(), dtype="float32",
                     max_model_len=2048, memory_fraction=0.3)
    t0 = time.perf_counter()
    with VllmServer(py, spec, log).start(timeout=900) as srv:
        startup = time.perf_counter() - t0
        model = served_model(srv.spec.url)
        complete_ids(srv.spec.url, model, prompts[0], 8)  # warm-up request, not timed
        t1 = time.perf_counter()
        if drafter is None:
            outs = [complete_ids(srv.spec.url, model, ids, max_new) for ids in prompts]
            acc = None
        else:
            a, _ = served_acceptance(srv.spec.url, prompts, max_new)
            outs, acc = a.outputs, a.to_dict()
        secs = time.perf_counter() - t1
    ntok = sum(len(o) for o in outs)
    return {"tokens": ntok, "seconds": secs, "tok_s": ntok / secs, "startup_s": startup, "acceptance": acc,
            "outputs": outs}


def _ours(engine, prompts, max_new: int, depth: int) -> dict:
    methods = {"plain": SpecConfig(mode="plain", max_new_tokens=max_new),
               "chain": SpecConfig(mode="chain", depth=depth, min_prob=0.0, max_new_tokens=max_new),
               "tree": SpecConfig(mode="tree", max_new_tokens=max_new)}
    secs = dict.fromkeys(methods, 0.0)
    toks = dict.fromkeys(methods, 0)
    engine.generate(prompts[0], SpecConfig(mode="plain", max_new_tokens=8))  # warm-up
    for ids in prompts:  # interleaved: every method sees the machine in the same state
        for name, cfg in methods.items():
            r = engine.generate(ids, cfg)
            secs[name] += r.metrics.time["total"]
            toks[name] += len(r.token_ids)
    return {m: {"tokens": toks[m], "seconds": secs[m], "tok_s": toks[m] / secs[m]} for m in methods}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--target", default="")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_vllm"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    ckpt = resolve_dir(a.drafter)
    source = a.target or read_provenance(ckpt).target.source
    t = load_target(source)
    drafter, points, _ = load_drafter_for(t, ckpt)
    engine = SpecEngine(t, drafter, points)
    prompts, _ = encode_prompt_file(engine, heldout_prompts_path(), a.num_prompts)
    py = find_python()
    export = Path(run_export(ExportConfig(ckpt=ckpt, format="vllm", out=a.out / "vllm", force=True,
                                          engine_version=vllm_version(py) or ""))["out"]).resolve()
    target_dir = resolve_target_dir(source)
    res = {"target": source, "drafter": str(ckpt), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
           "depth": a.depth, "vllm": vllm_version(py)}
    res["vllm_plain"] = _vllm_phase(py, target_dir, None, a.depth, prompts, a.max_new_tokens, a.out / "plain.log")
    res["eaglewire"] = _ours(engine, prompts, a.max_new_tokens, a.depth)
    res["vllm_drafter"] = _vllm_phase(py, target_dir, export, a.depth, prompts, a.max_new_tokens, a.out / "spec.log")
    res["predicted"] = predicted_acceptance(engine, prompts, a.depth, a.max_new_tokens).to_dict()
    res["outputs_equal"] = sum(x == y for x, y in zip(res["vllm_plain"].pop("outputs"), res["vllm_drafter"].pop("outputs")))
    _report(res)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2))


def _report(res: dict) -> None:
    ours, vp, vd = res["eaglewire"], res["vllm_plain"], res["vllm_drafter"]
    base, vbase = ours["plain"]["tok_s"], vp["tok_s"]
    rows = [("eaglewire plain", ours["plain"]), (f"eaglewire chain {res['depth']} (ungated)", ours["chain"]),
            ("eaglewire tree (default, gated)", ours["tree"]), ("vLLM plain", vp), (f"vLLM + drafter (eagle3, {res['depth']})", vd)]
    print(f"{res['prompts']} held-out prompts x {res['max_new_tokens']} tokens, target {res['target']}, vLLM {res['vllm']}")
    print("| method | tok/s | vs eaglewire plain | vs vLLM plain |\n|---|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | {r['tok_s'] / vbase:.2f}x |")
    s, p = vd["acceptance"], res["predicted"]
    print(f"mean acceptance length (depth {res['depth']}, ungated): vLLM {s['mean_acceptance_length']:.3f} "
          f"({s['accepted_per_pos']} of {s['drafts']} rounds), eaglewire {p['mean_acceptance_length']:.3f} "
          f"({p['accepted_per_pos']} of {p['drafts']}); vLLM outputs with = without drafter on {res['outputs_equal']} "
          f"of {res['prompts']} prompts; startup {vp['startup_s']:.0f} s / {vd['startup_s']:.0f} s")


if __name__ == "__main__":
    main()
