"""`eaglewire data ...`: option parsing and printing; the stages run in :mod:`.pipeline`."""

from __future__ import annotations

import json

import typer

from eaglewire.data.options import (
    DataBuildConfig,
    DataExtractConfig,
    DataGenerateConfig,
    DataImportConfig,
    DataInfoConfig,
    DataVocabConfig,
)
from eaglewire.data.pipeline import info, run_build, run_extract, run_generate, run_vocab
from eaglewire.infra.options import build_command


def _print(res: dict) -> None:
    print(json.dumps(res, indent=2, default=str))


def _human_info(r: dict) -> None:
    print(f"dataset {r['path']} ({'complete' if r['complete'] else 'INCOMPLETE'}), manifest {r['manifest_sha']}")
    print(f"  target      {r['target']}  fingerprint {r['target_fingerprint']}")
    print(f"  samples     {r['num_samples']}  tokens {r['num_tokens']}  loss tokens {r['num_loss_tokens']}  shards {r['num_shards']} ({r['store_dtype']})")
    p = r["points"]
    print("  slot  point            hf  sglang  vllm  mean|x|")
    for j, n in enumerate(p["names"]):
        ns = (r["norm_stats"] or [{}] * len(p["names"]))[j]
        print(f"  {j:>4}  {n:<15}{_s(p['hf_index'][j]):>4}{_s(p['sglang'][j]):>8}{_s(p['vllm'][j]):>6}  {ns.get('mean_norm', 0):.1f}")
    if r["vocab"]:
        print(f"  draft vocab {r['vocab']['size']}  coverage {r['vocab']['coverage']:.4f}")


def _s(v) -> str:
    return "null" if v is None else str(v)


def _data_import(cfg: DataImportConfig) -> None:
    from eaglewire.data.foreign import run_data_import

    r = run_data_import(cfg)
    if cfg.json:
        _print(r)
    else:
        print(f"imported {r['num_samples']} samples ({r['num_tokens']} tokens) from {r['format']} "
              f"into {r['out']}: points {r['points']}")


def register(app: typer.Typer) -> None:
    data = typer.Typer(no_args_is_help=True, help="Build training data: prompts -> target responses -> features -> draft vocab.")

    def out(fn):
        def run(cfg):
            from eaglewire.data.sharded import rank_world

            res = fn(cfg)
            if rank_world()[0] != 0:  # under torchrun one rank reports the job's (summed) result
                return
            if cfg.json:
                print(json.dumps(res, indent=2, default=str))
            else:
                _human_info(info(getattr(cfg, "out", None) or cfg.data, verify=False)) if fn is not run_generate else _print(res)
        return run

    build_command(data, "generate", DataGenerateConfig, out(run_generate), "Regenerate answers with the target (batched, resumable).")
    build_command(data, "extract", DataExtractConfig, out(run_extract), "Capture target features into checksummed shards (resumable).")
    build_command(data, "vocab", DataVocabConfig, out(run_vocab), "Build the draft vocabulary (d2t offsets, t2d mask) from loss-masked tokens.")
    build_command(data, "build", DataBuildConfig, out(run_build), "generate + extract + vocab in one command.")
    build_command(data, "info", DataInfoConfig,
                  lambda c: (_print if c.json else _human_info)(info(c.data, c.verify)),
                  "Show a dataset's provenance: target, points in every engine's ids, counts, vocab.")
    build_command(data, "import", DataImportConfig, _data_import,
                  "Import speculators hidden-state files or SpecForge offline captures as an eaglewire dataset.")
    app.add_typer(data, name="data")
