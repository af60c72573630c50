"""The demo report for a person: report.md and a self-contained report.html (plots inlined)."""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path

from eaglewire.decoding.bench import fmt_ratio


def _plot_training(run: Path, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = run / "train" / "metrics.csv"
    if not path.exists():
        return None
    rows = list(csv.DictReader(open(path)))
    tr = [r for r in rows if r["split"] == "train"]
    va = [r for r in rows if r["split"] == "val"]
    accs = [k for k in rows[0] if k.startswith("acc_")] if rows else []
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].plot([int(r["step"]) for r in tr], [float(r["loss"]) for r in tr], lw=0.8, label="train")
    if va:
        ax[0].plot([int(r["step"]) for r in va], [float(r["loss"]) for r in va], "o-", label="validation")
    ax[0].set(title="TTT loss", xlabel="step")
    ax[0].legend()
    for k in accs:
        ax[1].plot([int(r["step"]) for r in va], [float(r[k]) for r in va], "o-", ms=3, label=k)
    ax[1].set(title="validation accuracy per TTT step", xlabel="step", ylim=(0, 1))
    ax[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _img(path: Path | None) -> str:
    if not path or not path.exists():
        return "<p><em>(plot not available)</em></p>"
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{b64}" style="max-width:100%">'


def _export_cmds(run: Path) -> list[tuple[str, str]]:
    from eaglewire.drafter.checkpoint import read_provenance
    from eaglewire.target.points import id_lists

    ck = run / "train" / "drafter"
    prov = read_provenance(ck)
    pts = id_lists(prov.points, prov.num_layers)
    return [
        ("Capture points (physical)", ", ".join(pts["names"])),
        ("SGLang ids (eagle_config.eagle_aux_hidden_state_layer_ids)", str(pts["sglang"])),
        ("vLLM ids (top-level eagle_aux_hidden_state_layer_ids)", str(pts["vllm"])),
        ("Export for SGLang", f"eaglewire export {ck} --format sglang --out {run}/export/sglang"),
        ("Serve with SGLang", f"python -m sglang.launch_server --model <target> --speculative-algorithm EAGLE3 "
                              f"--speculative-draft-model-path {run}/export/sglang --speculative-num-steps 4 "
                              f"--speculative-eagle-topk 4 --speculative-num-draft-tokens 16"),
        ("Export for vLLM", f"eaglewire export {ck} --format vllm --out {run}/export/vllm"),
        ("Serve with vLLM", f"vllm serve <target> --speculative-config "
                            f"'{{\"method\": \"eagle3\", \"model\": \"{run}/export/vllm\", \"num_speculative_tokens\": 4}}'"),
        ("Check a deployment", f"eaglewire doctor config {run}/export/vllm --engine vllm --trained-on {ck}"),
    ]


def _bench_rows(bench: dict) -> list[list[str]]:
    rows = []
    for name, m in bench.get("methods", {}).items():
        pp = (m.get("accept_per_position") or {}).get("cumulative") or []
        rows.append([name, f"{m['tokens_per_s']:.1f}", fmt_ratio(m, "speedup"), fmt_ratio(m, "speedup_vs_plain"),
                     f"{m['tau']:.2f}" if m.get("tau") else "-", " ".join(f"{x:.2f}" for x in pp) or "-",
                     str(m.get("differ_from_baseline", "-"))])
    return rows


def _category_rows(bench: dict) -> list[list[str]]:
    rows = []
    for cat, r in (bench.get("categories") or {}).items():
        cells = [cat, str(r["prompts"])]
        for m in ("eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup"):
            c = r.get(m) or {}
            cells += [f"{c['tau']:.2f}" if c.get("tau") else "-",
                      f"{c['speedup_vs_plain']:.2f}x" if c.get("speedup_vs_plain") else "-"]
        rows.append(cells)
    return rows


def _prediction_rows(log: dict) -> list[list[str]]:
    """Offline (doctor, held-out split) vs serving (bench, held-out prompts) chain tau."""
    rows = []
    for r in log.get("doctor", {}).get("reports", []):
        off = r.get("offline")  # Report.to_dict spreads its data at the top level
        if r.get("command") == "drafter" and off:
            bench = log.get("bench", {})
            serve = (bench.get("methods", {}).get("eaglewire_chain") or {}).get("tau")
            gated = (bench.get("config") or {}).get("min_prob") or 0.0
            err = f"{(off['tau_chain'] - serve) / serve:+.1%}" if serve else "-"
            shown = f"{serve:.2f}" if serve else "-"
            if serve and gated:  # gated rounds count tau 1: not the ungated chain the offline tau describes
                shown += f" (with --min-prob {gated})"
                err = "not comparable: rerun bench with --min-prob 0"
            rows.append([f"chain depth {off['depth']}", f"{off['tau_chain']:.2f}", r.get("split", "-"), shown, err,
                         " ".join(f"{a:.3f}" for a in off["acc"])])
    return rows


def _doctor_rows(doc: dict) -> list[list[str]]:
    rows = []
    for r in doc.get("reports", []):
        for c in r["checks"]:
            rows.append([r["command"], c["name"], "PASS" if c["ok"] else ("WARN" if c["level"] == "warning" else "FAIL"), c["detail"]])
    return rows


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in rows]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{html.escape(x)}</th>" for x in head)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def write_report(run: Path, preset: str, p: dict, log: dict) -> dict:
    train_png = _plot_training(run, run / "training.png")
    bench = log.get("bench", {})
    bench_png = Path(bench["files"]["png"]) if bench.get("files") else None
    data = log.get("data", {})
    val = log.get("train", {}).get("validation", {})
    small = preset == "quick"
    sections = [
        ("Run", [["preset", preset + (" (a SMALL run: minutes of CPU; see 'How to get more')" if small else "")],
                 ["settings", json.dumps(p)], ["validation acc per TTT step (in-draft-vocab positions)", " ".join(f"{a:.3f}" for a in val.get("acc", []))],
                 ["eaglewire plain vs transformers generate (no speculation)",
                  f"{bench['plain_vs_hf_generate']:.2f}x: speculation's own gain is the 'vs eaglewire plain' column"
                  if bench.get("plain_vs_hf_generate") else "-"],
                 ["stage seconds", ", ".join(f"{k} {v.get('seconds', 0):.0f}s" for k, v in log.items())],
                 ["dataset", json.dumps({k: data.get(k) for k in ("vocab",)} | {"samples": (data.get("extract") or {}).get("num_samples")})]]),
        ("Speed (greedy, shipped held-out prompts, methods interleaved per prompt)", _bench_rows(bench)),
        ("Per category (held-out prompts)", _category_rows(bench)),
        ("Does the offline tau predict serving?", _prediction_rows(log)),
        ("Doctor verdicts", _doctor_rows(log.get("doctor", {}))),
        ("Export and serve", [[a, b] for a, b in _export_cmds(run)]),
    ]
    heads = [["item", "value"], ["method", "tok/s", "vs transformers generate", "vs eaglewire plain", "tau",
                                 "cumulative acceptance per position", "prompts differing"],
             ["category", "prompts", "chain tau", "chain vs plain", "tree tau", "tree vs plain",
              "tree+lookup tau", "tree+lookup vs plain"],
             ["doctor drafter", "offline tau", "evaluated on", "serving tau (bench)", "offline error",
              "acc per step (all loss positions, as SpecForge/EAGLE-3 count)"],
             ["doctor", "check", "verdict", "detail"], ["what", "command / value"]]
    more = (f"This is the quick preset: a drafter trained for minutes on {p.get('topic_prompts', '?')} composed "
            "prompts. tau and speedup grow with data and training: run `eaglewire demo --preset standard` "
            "(about an hour here) or train on more prompts with `eaglewire data build --topic-prompts N`.")
    md = [f"# eaglewire demo report ({preset})", "", more if small else "", "", "![training](training.png)", ""]
    if bench_png:
        md += [f"![speed]({bench_png.relative_to(run) if bench_png.is_relative_to(run) else bench_png})", ""]
    for (title, rows), head in zip(sections, heads):
        md += [f"## {title}", "", _md_table(head, rows), ""]
    (run / "report.md").write_text("\n".join(md))
    css = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left}th{background:#f0f0f0}"
           ".note{background:#fff6d6;padding:8px;border-left:4px solid #e0b000}")
    body = [f"<h1>eaglewire demo report ({html.escape(preset)})</h1>"]
    if small:
        body.append(f'<p class="note">{html.escape(more)}</p>')
    body += ["<h2>Training curves</h2>", _img(train_png), "<h2>Speedup</h2>", _img(bench_png)]
    for (title, rows), head in zip(sections, heads):
        body += [f"<h2>{html.escape(title)}</h2>", _html_table(head, rows)]
    (run / "report.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>eaglewire report</title>"
                                     f"<style>{css}</style></head><body>{''.join(body)}</body></html>")
    return {"report_html": str(run / "report.html"), "report_md": str(run / "report.md")}
