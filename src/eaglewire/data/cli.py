"""`eaglewire data ...`: option parsing and printing; the stages run in :mod:`.pipeline`."""

from __future__ import annotations

import typer

from eaglewire.data.config import (
    DataBuildConfig,
    DataExtractConfig,
    DataGenerateConfig,
    DataImportConfig,
    DataInfoConfig,
    DataVocabConfig,
)
from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit, to_json
from eaglewire.infra.ranks import is_main


def _print(res: dict) -> None:
    print(to_json(res))


def _human_info(r: dict) -> None:
    print(f"dataset {r['path']} ({'complete' if r['complete'] else 'INCOMPLETE'}), manifest {r['manifest_sha']}")
    print(f"  target      {r['target']}  fingerprint {r['target_fingerprint']}")
    print(f"  samples     {r['num_samples']}  tokens {r['num_tokens']}  loss tokens {r['num_loss_tokens']}  shards {r['num_shards']} ({r['store_dtype']})")
    a = r.get("answer_tokens")
    how = (f"{a.get('target_ids', 0)} as the target's generated ids, {a.get('retokenized_text', 0)} re-tokenised from text"
           if isinstance(a, dict) else a)
    print(f"  answers     {how}")
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

    emit(run_data_import(cfg), cfg.json,
         lambda r: print(f"imported {r['num_samples']} samples ({r['num_tokens']} tokens) from {r['format']} "
                         f"into {r['out']}: points {r['points']}"))


def register(app: typer.Typer) -> None:
    data = typer.Typer(no_args_is_help=True, help="Build training data: prompts -> target responses -> features -> draft vocab.")

    def out(name: str):
        def run(cfg):
            from eaglewire.data import pipeline  # lazy: the stages load torch, `--help` must not
            from eaglewire.data.sharded import leave

            res = getattr(pipeline, name)(cfg)
            if is_main():  # under torchrun one rank reports the job's (summed) result
                d = getattr(cfg, "out", None) or cfg.data
                emit(res, cfg.json, _print if name == "run_generate" else lambda _: _human_info(pipeline.info(d, verify=False)))
            leave()  # the others wait for it: none exits while a peer still holds its connection
        return run

    build_command(data, "generate", DataGenerateConfig, out("run_generate"), "Regenerate answers with the target (batched, resumable).")
    def extract(cfg: DataExtractConfig):
        if cfg.print_command:
            from eaglewire.data.extract_vllm import print_command

            return print(print_command(cfg))
        return out("run_extract")(cfg)

    build_command(data, "extract", DataExtractConfig, extract, "Capture target features into checksummed shards (resumable).")
    build_command(data, "vocab", DataVocabConfig, out("run_vocab"), "Build the draft vocabulary (d2t offsets, t2d mask) from loss-masked tokens.")
    build_command(data, "build", DataBuildConfig, out("run_build"), "generate + extract + vocab in one command.")
    def info(c: DataInfoConfig) -> None:
        from eaglewire.data.pipeline import info as dataset_info

        emit(dataset_info(c.data, c.verify), c.json, _human_info)

    build_command(data, "info", DataInfoConfig, info,
                  "Show a dataset's provenance: target, points in HF, SGLang and vLLM ids, counts, vocab.")
    build_command(data, "import", DataImportConfig, _data_import,
                  "Import speculators hidden-state files or SpecForge offline captures as an eaglewire dataset.")
    app.add_typer(data, name="data")
