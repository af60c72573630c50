"""The report's way out: export, serve and check commands for this run, and how to get more.

Every path named is one the demo made (the exports come from the doctor
stage), and the serve flags are the chain the bench measured, written by the
same builder `eaglewire serve` uses, so a command copied from the report runs
what the report describes and what `doctor live` can check.
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglewire.decoding.shapes import DEFAULTS
from eaglewire.demo.config import PRESETS
from eaglewire.engines.sglang import launch_line
from eaglewire.export.written import RECORD
from eaglewire.saved.checkpoint import read_provenance
from eaglewire.targets.points import id_lists

# the layouts the demo exports, each checked by `doctor config` with its engine (llama.cpp's GGUF: its own stage)
FORMATS = ("sglang", "vllm")


def _shape(bench: dict) -> dict:
    c = bench.get("config") or {}
    return {"depth": c.get("depth", DEFAULTS["chain_depth"]), "top_k": c.get("top_k", DEFAULTS["top_k"]),
            "tree_depth": c.get("tree_depth", DEFAULTS["tree_depth"]),
            "total_tokens": c.get("total_tokens", DEFAULTS["total_tokens"]), "min_prob": c.get("min_prob") or 0.0}


def serve_rows(run: Path, bench: dict) -> list[list[str]]:
    """Serve commands for the benchmarked chain, SGLang's from the builder `serve` uses: one shape everywhere."""
    s = _shape(bench)
    rows = [["Serve with SGLang", launch_line("<target>", f"{run}/export/sglang", s["depth"])],
            ["Serve with vLLM", f"vllm serve <target> --speculative-config '{{\"method\": \"eagle3\", \"model\": "
                                f"\"{run}/export/vllm\", \"num_speculative_tokens\": {s['depth']}}}'"]]
    gate = f"--min-prob {s['min_prob']} and " if s["min_prob"] else ""
    rows.append(["Why these flags", f"both engines get the benchmarked chain (depth {s['depth']}), the shape "
                 "`eaglewire serve` starts and `eaglewire doctor live` can check; SGLang can also draft a tree "
                 "(--speculative-eagle-topk above 1, as the eaglewire_tree row here), which `doctor live` cannot check. "
                 f"{gate}the lookup branch have no engine flag, and on a GPU, where a wide verify costs about one "
                 "decode step, a wider tree usually pays (docs/results.md): measure with `eaglewire bench "
                 "--auto-shape N`. <target>: the target model as your engine loads it."])
    return rows


def check_commands(run: Path) -> list[tuple[str, str]]:
    """(engine, `doctor config` command) for each export the demo made, the training checkpoint as reference."""
    ck = run / "train" / "drafter"
    return [(fmt, f"eaglewire doctor config {run}/export/{fmt} --engine {fmt} --trained-on {ck}")
            for fmt in FORMATS if (run / "export" / fmt).is_dir()]


def export_rows(run: Path, log: dict) -> list[list[str]]:
    ck = run / "train" / "drafter"
    prov = read_provenance(ck)
    pts = id_lists(prov.points, prov.num_layers)
    rows = [["Capture points (physical)", ", ".join(pts["names"])],
            ["SGLang ids (eagle_config.eagle_aux_hidden_state_layer_ids)", str(pts["sglang"])],
            ["vLLM ids (top-level eagle_aux_hidden_state_layer_ids)", str(pts["vllm"])]]
    refused = {r["format"]: r for r in (log.get("doctor") or {}).get("refused", [])}
    for fmt in FORMATS:
        cmd = f"eaglewire export {ck} --format {fmt} --out {run}/export/{fmt}"
        made = (run / "export" / fmt).is_dir()
        rows.append([f"Export for {fmt}", f"refused, nothing written: {refused[fmt]['refusal']}" if fmt in refused
                     else f"made by the demo: {run}/export/{fmt}{_ids(run / 'export' / fmt)} (to remake: {cmd} --force)"
                     if made else f"{cmd} (not made in this run)"])
    if gguf := (log.get("llamacpp") or {}).get("refused"):
        rows.append(["Export for gguf (llama.cpp)", f"refused, nothing written: {gguf}"])
    rows += serve_rows(run, log.get("bench", {}))
    rows += [[f"Check a deployment ({fmt})", cmd] for fmt, cmd in check_commands(run)]
    return rows


def _ids(export: Path) -> str:
    """The ids an export wrote, from its own record: on some targets (SGLang's DeepSeek family) an engine's ids
    differ from the generic rows above."""
    try:
        rec = json.loads((export / RECORD).read_text())
    except (OSError, ValueError):
        return ""
    return f", ids {rec['ids']} ({rec['engine']})" if isinstance(rec, dict) and "ids" in rec and "engine" in rec else ""


def more_lines(preset: str, p: dict, log: dict) -> list[str]:
    """What more data, training, the standard preset or a GPU would give: this run's figures, README's for the rest."""
    ex = (log.get("data") or {}).get("extract") or {}
    acc = (log.get("train") or {}).get("validation", {}).get("acc") or []
    off = next((r.get("offline") for r in log.get("doctor", {}).get("reports", []) if r.get("command") == "drafter"), None)
    this = (f"This run trained on {ex.get('num_samples', '?')} answers ({ex.get('num_tokens', '?')} tokens) for "
            f"{(log.get('train') or {}).get('steps', '?')} steps"
            + (f"; validation acc at TTT step 1 {acc[0]:.3f}" if acc else "")
            + (f"; offline chain tau {off['tau_chain']:.2f}" if off else "")
            + ". Acceptance, and with it the speedup, grows with data and training:")
    std = PRESETS["standard"]
    lines = [this]
    if preset != "standard":
        lines.append(f"- `eaglewire demo --preset standard`: {std['topic_prompts']} composed prompts instead of "
                     f"{p.get('topic_prompts', '?')}, {std['bench_prompts']} bench prompts, about an hour on 2 CPU "
                     "cores; both presets' figures side by side are in docs/results.md ('The demo, both presets').")
    lines += ["- More data: `eaglewire data build --topic-prompts N`, then `eaglewire train` on it (docs/results.md: "
              "held-out acceptance grows by about 0.065 per doubling of the training tokens; a third pass gave +0.025, paired).",
              "- A GPU: a wide verify costs about one decode step there, so the same acceptance turns into more "
              "speedup (docs/results.md, 'Why the speedup trails tau on this CPU'); `--min-prob` defaults to 0 and "
              "`eaglewire bench --auto-shape N` picks a wider tree.",
              "- Firmer timings: `eaglewire bench ... --repeats 3` gives each ratio a range over repeats."]
    return lines
