"""Commands of the export stage: `export` and `import` of drafters.

Warnings (e.g. SGLang versions reading the written ids differently) go both
into the JSON result and to stderr, so neither a script nor a person misses them.
"""

from __future__ import annotations

import sys

from eaglewire.infra.output import emit


def _print(res: dict, as_json: bool, line: str) -> None:
    for w in res.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if res.get("replaced"):
        print(f"note: {res['replaced']}", file=sys.stderr)
    emit(res, as_json, lambda _: print(line))


def register(app) -> None:
    from eaglewire.export.config import ExportConfig, ImportConfig
    from eaglewire.infra.options import build_command

    def export(cfg: ExportConfig) -> None:
        from eaglewire.export.exporter import run_export

        r = run_export(cfg)
        ids = "no ids (hard-coded)" if r["ids"] is None else f"ids {r['ids']} in {r['ids_key']}"
        if r.get("kind") == "dflash":  # the numbering named: z-lab and vLLM ids for one point differ by one
            ids = f"{r['ids_written']} in {r['ids_key']}"
        _print(r, cfg.json, f"wrote {r['format']} drafter to {r['out']}: points {r['points']} -> {ids}"
                            f" (for {r['engine']})" + "".join(f"\n  assumed: {a}" for a in r["assumed"]))

    def imp(cfg: ImportConfig) -> None:
        from eaglewire.export.importer import run_import

        r = run_import(cfg)
        read = f" ({r['ids_read']}, read from {r['ids_key']})" if r.get("kind") == "dflash" else ""
        _print(r, cfg.json, f"imported {r['format']} drafter into {r['out']}: points {r['points']}{read}"
                            + "".join(f"\n  assumed: {a}" for a in r["assumed"]))

    build_command(app, "export", ExportConfig, export,
                  "Export a drafter for SGLang/SpecForge, vLLM, speculators or the official EAGLE code.")
    build_command(app, "import", ImportConfig, imp,
                  "Import an SGLang/SpecForge, vLLM, speculators or official EAGLE drafter as an eaglewire checkpoint.")
