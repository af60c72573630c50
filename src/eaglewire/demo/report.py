"""The demo report for a person: report.md and a self-contained report.html (plots inlined).

It is written from the stage results alone (`stages/*.json`, the training
metrics and the checkpoint's provenance), so a finished run's report can be
regenerated without rerunning anything. What it says lives in findings.py,
acceptance.py and deploy.py; this module lays it out.
"""

from __future__ import annotations

import base64
import csv
import html
from pathlib import Path

from eaglewire.decoding.bench import fmt_ratio, plot_speed
from eaglewire.demo.acceptance import prediction_row, tau_relation, tau_rows
from eaglewire.demo.deploy import export_rows, more_lines
from eaglewire.demo.findings import caveats, doctor_rows, round_cost, verdict_lines, verdict_tone
from eaglewire.engines.llama_server import DEFAULT_P_MIN
from eaglewire.infra.plots import pyplot

LOSS_LABEL = "loss (nats/token, sum over TTT steps)"
# six rows, two measures: tau and the mean acceptance length both count 1 + accepted drafts per round
ACCEPTANCE = "Acceptance (tau and mean acceptance length, incl. the bonus token): what each row counts"


def _plot_training(run: Path, out: Path) -> Path | None:
    plt = pyplot()

    path = run / "train" / "metrics.csv"
    rows = list(csv.DictReader(open(path))) if path.exists() else []
    if not rows:
        return None
    tr = [r for r in rows if r["split"] == "train"]
    va = [r for r in rows if r["split"] == "val"]
    vs = [int(r["step"]) for r in va]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].plot([int(r["step"]) for r in tr], [float(r["loss"]) for r in tr], lw=0.7, alpha=0.7, label="train (per step)")
    ax[0].plot(vs, [float(r["loss"]) for r in va], "o", color="tab:red", label="validation")
    for s, r in zip(vs, va):  # a validation point is one evaluation: say when it was taken
        ax[0].annotate(f"step {s}", (s, float(r["loss"])), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7)
    ax[0].set(title="TTT loss", xlabel="optimizer step", ylabel=LOSS_LABEL)
    ax[0].legend(fontsize=8)
    for k in (k for k in rows[0] if k.startswith("acc_")):
        ax[1].plot(vs, [float(r[k]) for r in va], "o", ms=6, label=f"TTT step {int(k[4:]) + 1}")
    if vs:
        ax[1].set_xticks(vs, [f"step {s}" for s in vs], fontsize=8)
        ax[1].set_xlim(0, max(int(r["step"]) for r in rows) * 1.05)
    ax[1].set(title="validation accuracy per TTT step (held-out split)", xlabel="optimizer step",
              ylabel="top-1 agreement with the target (fraction)", ylim=(0, 1))
    ax[1].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_speed(bench: dict, out: Path) -> Path | None:
    """Drawn from the bench result here, not copied from bench/, so a regenerated report gets today's chart."""
    if not bench.get("methods"):
        return None
    plot_speed(bench, out)
    return out


def _img(path: Path | None) -> str:
    if not path or not path.exists():
        return "<p><em>(plot not available)</em></p>"
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{b64}" style="max-width:100%">'


def _bench_rows(bench: dict) -> list[list[str]]:
    rows = []
    for name, m in bench.get("methods", {}).items():
        pp = (m.get("accept_per_position") or {}).get("cumulative") or []
        rows.append([name, f"{m['tokens_per_s']:.1f}", fmt_ratio(m, "speedup_vs_plain"), fmt_ratio(m, "speedup"),
                     f"{m['tau']:.2f}" if m.get("tau") else "-", " ".join(f"{x:.2f}" for x in pp) or "-",
                     str(m.get("differ_from_baseline", "-"))])
    return rows


def _time_rows(bench: dict) -> list[list[str]]:
    """Per speculative method: a round's draft and verify time against a plain decode step, and the tokens it gave."""
    rows = []
    for name, m in bench.get("methods", {}).items():
        cost = round_cost(bench, name) if name != "eaglewire_plain" else None
        if not cost or not m.get("tau"):
            continue
        rows.append([name, f"{cost['plain_ms']:.1f}", f"{cost['draft_ms']:.1f}", f"{cost['verify_ms']:.1f}",
                     f"{cost['ratio']:.2f}", f"{m['tau']:.2f}", f"{m['tau'] / cost['ratio']:.2f}x"])
    return rows


TIME_LINES = ["A round pays when the tokens it gives (tau) exceed what it costs in plain decode steps; their quotient "
              "is the speedup the split predicts (the measured one also pays prefill and the rounds' bookkeeping). "
              "Draft time shrinks with a smaller draft vocabulary or depth; verify time is the target's forward over "
              "the drafted tokens, which the engine keeps near one decode step (bench_decoding.py)."]


def _category_rows(bench: dict) -> list[list[str]]:
    """A category's speedup rests on its few prompts (often one): each speed cell says on how many."""
    rows = []
    for cat, r in (bench.get("categories") or {}).items():
        cells = [cat, str(r["prompts"])]
        for m in ("eaglewire_chain", "eaglewire_tree", "eaglewire_tree_lookup"):
            c = r.get(m) or {}
            cells += [f"{c['tau']:.2f}" if c.get("tau") else "-",
                      f"{c['speedup_vs_plain']:.2f}x (n={r['prompts']})" if c.get("speedup_vs_plain") else "-"]
        rows.append(cells)
    return rows


def _category_lines(bench: dict) -> list[str]:
    cats = bench.get("categories") or {}
    ones = [c for c, r in cats.items() if r["prompts"] == 1]
    if not ones:
        return []
    return [f"n = the prompts a category's figure rests on; {len(ones)} of {len(cats)} categories rest on one prompt "
            f"(n=1), so their figure is that prompt's, not the category's: the totals in 'Speed' rest on all "
            f"{bench.get('num_prompts', '?')} prompts."]


def _kv(d: dict) -> str:
    """``key value, ...``: settings for a person to read, not JSON to parse."""
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _dataset(data: dict) -> str:
    ex, voc = data.get("extract") or {}, data.get("vocab") or {}
    out = f"{ex.get('num_samples', '?')} samples, {ex.get('num_tokens', '?')} tokens"
    if voc.get("size"):
        out += f"; draft vocab {voc['size']} tokens" + (f", covering {voc['coverage']:.1%} of the answer tokens"
                                                        if voc.get("coverage") is not None else "")
    return out


def _run_rows(preset: str, p: dict, log: dict) -> list[list[str]]:
    bench = log.get("bench", {})
    val = log.get("train", {}).get("validation", {})
    return [["preset", preset + (" (a SMALL run: minutes of CPU; see 'How to get more')" if preset == "quick" else "")],
            ["settings", _kv(p)],
            ["validation acc per TTT step (in-draft-vocab positions)", " ".join(f"{a:.3f}" for a in val.get("acc", []))],
            ["eaglewire plain vs transformers generate (no speculation)",
             f"{bench['plain_vs_hf_generate']:.2f}x: speculation's own gain is the 'vs eaglewire plain' column"
             if bench.get("plain_vs_hf_generate") else "-"],
            ["dataset", _dataset(log.get("data", {}))]]


def _llama_rows(lc: dict) -> list[list[str]]:
    tps = lc.get("tokens_per_s") or {}
    if not tps:
        return []
    base = tps.get("llama.cpp plain")
    mal = lc.get("mean_acceptance_length")
    rows = []
    for name, v in tps.items():
        spec = name == "llama.cpp + drafter"
        gate = f", p-min {lc['p_min']:g}" if lc.get("p_min") else ""
        label = f"{name} (depth {lc['depth']}{gate}, {lc['drafter_type']} GGUF)" if spec else name
        pred = lc.get("predicted_mean_acceptance_length")
        acc = f"{mal:.2f} over {lc['rounds']} rounds" + (f" (eaglewire predicts {pred:.2f})" if pred else "")
        rows.append([label, f"{v:.1f}", f"{v / base:.2f}x" if base else "-", acc if spec and mal else "-",
                     f"{lc['outputs_equal_plain']} of {lc['prompts']}" if spec else "-"])
    return rows


def _llama_lines(lc: dict) -> list[str]:
    if lc.get("skipped"):
        return [f"Not measured: {lc['skipped']}."]
    if not lc.get("tokens_per_s"):
        return []
    return [f"The target served from {lc['target_gguf']} (F32, so llama.cpp and eaglewire decode the same weights), the "
            f"drafter from {lc['export']} (eagle3.target_layers {lc['ids']}). Serve it yourself: "
            "`eaglewire serve RUN/train --engine llama.cpp --depth 2` (llama.cpp's draft gate `--p-min` defaults to "
            f"{DEFAULT_P_MIN:g} there; docs/results.md has the depths, gates and types compared)."]


def _minutes(s: float) -> str:
    return f"{s:.0f} s ({s / 60:.1f} min)"


def _stage_rows(log: dict) -> list[list[str]]:
    """Each stage's wall time from its marker's "seconds", and their total: what the run took end to end."""
    secs = {k: v["seconds"] for k, v in log.items() if isinstance(v, dict) and isinstance(v.get("seconds"), (int, float))}
    return [[k, _minutes(v)] for k, v in secs.items()] + ([["total", _minutes(sum(secs.values()))]] if secs else [])


def _sections(run: Path, preset: str, p: dict, log: dict) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """(title, table head, rows, lines after the table) in reading order."""
    bench = log.get("bench", {})
    pred = prediction_row(log)
    pred_line = [f"Does the offline figure predict serving? Offline {pred[0]}: {pred[1]}, against bench's chain "
                 f"tau {pred[3]}: {pred[4]}."] if pred else []
    return [
        ("Speed (greedy, shipped held-out prompts, methods interleaved per prompt)",
         ["method", "tok/s", "vs eaglewire plain", "vs transformers generate", "tau (bench; see Acceptance)",
          "cumulative acceptance per position", "prompts differing from transformers generate"], _bench_rows(bench), []),
        ("Where the time goes (per verify round, from the bench's own timers)",
         ["method", "plain decode step (ms)", "draft (ms)", "verify (ms)", "round in plain steps", "tau",
          "tau / round cost"], _time_rows(bench), TIME_LINES),
        ("llama.cpp, the CPU engine people run (same prompts, methods interleaved per prompt)",
         ["method", "tok/s", "vs llama.cpp plain", "mean acceptance length (llama.cpp's counters)",
          "outputs equal to llama.cpp plain"], _llama_rows(log.get("llamacpp") or {}),
         _llama_lines(log.get("llamacpp") or {})),
        (ACCEPTANCE, ["measurement", "value", "what it counts", "evaluated on"],
         tau_rows(log, run), [tau_relation(log)] + pred_line),
        ("Per category (held-out prompts; n = prompts per figure)", ["category", "prompts", "chain tau",
                                                                     "chain vs plain", "tree tau", "tree vs plain",
                                                                     "tree+lookup tau", "tree+lookup vs plain"],
         _category_rows(bench), _category_lines(bench)),
        ("Doctor verdicts", ["doctor", "check", "verdict", "detail"], doctor_rows(log.get("doctor", {})), []),
        ("Export, serve and check a deployment", ["what", "command / value"], export_rows(run, log), []),
        ("How to get more", [], [], more_lines(preset, p, log)),
        ("Run", ["item", "value"], _run_rows(preset, p, log), []),
        ("Wall time per stage", ["stage", "wall time"], _stage_rows(log),
         ["From each stage's marker (stages/*.json); a stage kept from an earlier run counts with that run's time, "
          "and writing this report is not included."]),
    ]


def _md_lines(lines: list[str]) -> list[str]:
    """Paragraphs apart (Markdown would join adjacent lines into one), list items together."""
    out: list[str] = []
    for x in lines:
        if out and not (x.startswith("- ") and out[-1].startswith("- ")):
            out.append("")
        out.append(x)
    return out


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in rows]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{_inline(x)}</th>" for x in head)
    b = "".join("<tr>" + "".join(f"<td>{_inline(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _inline(text: str) -> str:
    """Markdown's `code` as HTML, the rest escaped."""
    return "".join(f"<code>{x}</code>" if i % 2 else x for i, x in enumerate(html.escape(text).split("`")))


def _html_line(line: str) -> str:
    return f"<li>{_inline(line[2:])}</li>" if line.startswith("- ") else f"<p>{_inline(line)}</p>"


CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}"
       "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left}th{background:#f0f0f0}"
       ".verdict{background:#e8f4e8;padding:10px;border-left:5px solid #2a8a2a;font-size:15px}"
       ".verdict.bad{background:#fbe9e9;border-left-color:#b22}"
       ".verdict.slow{background:#fdf3e1;border-left-color:#c80}"
       ".note{background:#fff6d6;padding:8px;border-left:4px solid #e0b000}code{background:#f4f4f4}")


BOX = {"bad": " bad", "amber": " slow", "good": ""}  # verdict_tone -> the verdict box's CSS class


def write_report(run: Path, preset: str, p: dict, log: dict) -> dict:
    train_png = _plot_training(run, run / "training.png")
    speed_png = _plot_speed(log.get("bench", {}), run / "speed.png")
    # how the preset was fitted to this target (demo/fit.py) comes first: every figure below was made with it
    (verdict, *more), notes = verdict_lines(log), [*log.get("fitted", []), *caveats(log, run, p)]
    if preset == "quick":
        notes.append(f"This is the quick preset: a drafter trained for minutes on {p.get('topic_prompts', '?')} "
                     "composed prompts; see 'How to get more'.")
    sections = _sections(run, preset, p, log)
    md = [f"# eaglewire demo report ({preset})", "", f"**{verdict}**", "", *(f"- {x}" for x in more), ""]
    md += [x for n in notes for x in (f"> {n}", "")]
    md += ["![training](training.png)", ""] + (["![speed](speed.png)", ""] if speed_png else [])
    for title, head, rows, after in sections:
        md += [f"## {title}", ""] + ([_md_table(head, rows), ""] if head else []) + _md_lines(after) + [""]
    (run / "report.md").write_text("\n".join(md))
    body = [f"<h1>eaglewire demo report ({html.escape(preset)})</h1>", f'<p class="verdict{BOX[verdict_tone(log)]}"><b>{_inline(verdict)}</b>'
            + "".join(f"<br>{_inline(x)}" for x in more) + "</p>"]
    body += [f'<p class="note">{_inline(n)}</p>' for n in notes]
    body += ["<h2>Training curves</h2>", _img(train_png), "<h2>Speed</h2>", _img(speed_png)]
    for title, head, rows, after in sections:
        lis = [_html_line(x) for x in after]
        body += [f"<h2>{html.escape(title)}</h2>"] + ([_html_table(head, rows)] if head else [])
        body += [x for x in lis if x.startswith("<p>")] + (["<ul>" + "".join(x for x in lis if x.startswith("<li>")) + "</ul>"]
                                                           if any(x.startswith("<li>") for x in lis) else [])
    (run / "report.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>eaglewire report</title>"
                                     f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    return {"report_html": str(run / "report.html"), "report_md": str(run / "report.md"), "verdict": "\n".join([verdict, *more])}
