"""Capture through vLLM beside capture in process: throughput, equality, and the drafter each trains.

    python benchmarks/bench_capture_vllm.py --answers runs/demo-quick/data --samples 160 \\
        --train-steps 300 --json runs/bench_capture_vllm.json

The same regenerated answers are extracted twice (`data extract`, then `data extract
--engine vllm` with a managed vLLM server), one after the other so they never share the
cores. Reported: tokens per second of each capture (the vLLM server's startup is timed
separately: it is paid once per dataset), the largest relative error per slot, and the
validation accuracy of a drafter trained on each dataset with the same seed and steps,
plus a second seed on the in-process data as the noise floor.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import time
from pathlib import Path

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from eaglewire.data.config import DataExtractConfig, DataVocabConfig  # noqa: E402
from eaglewire.data.jsonl import read_jsonl  # noqa: E402
from eaglewire.data.pipeline import run_extract, run_vocab  # noqa: E402
from eaglewire.training.config import TrainConfig  # noqa: E402
from eaglewire.training.loop import run_train  # noqa: E402


def _answers(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir(parents=True)
    rows = read_jsonl(src / "responses.jsonl")[:n]
    (dst / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("generate.config.json", "prompts.jsonl"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


def _extract(d: Path, target: str, engine: str) -> dict:
    t0 = time.perf_counter()
    run_extract(DataExtractConfig(data=d, target=target, engine=engine, device="cpu", dtype="fp32",
                                store_dtype="bf16"))
    run_vocab(DataVocabConfig(data=d))
    man = json.loads((d / "manifest.json").read_text())
    return {"engine": engine, "tokens": man["num_tokens"], "tok_s": man["extract_tokens_per_s"],
            "wall_s": time.perf_counter() - t0, "capture": man.get("capture")}


def _slot_errors(a: Path, b: Path) -> dict:
    def cat(d, k):
        return torch.cat([load_file(str(p))[k].float() for p in sorted(d.glob("shard-*.safetensors"))])

    out = {}
    for k in ("features", "target_hidden"):
        x, y = cat(a, k), cat(b, k)
        if k == "features":
            out[k] = [float((y[:, j] - x[:, j]).norm() / x[:, j].norm()) for j in range(x.shape[1])]
        else:
            out[k] = float((y - x).norm() / x.norm())
    return out


def _train(d: Path, out: Path, steps: int, seed: int) -> float:
    run_train(TrainConfig(data=d, out=out, device="cpu", max_steps=steps, batch_size=2, lr=3e-3, max_len=512,
                          ttt_steps=3, init="target", freeze_head=True, seed=seed, save_every=10**6,
                          val_fraction=0.1))
    with open(out / "metrics.csv") as f:
        val = [r for r in csv.DictReader(f) if r["split"] == "val"]
    return float(val[-1]["acc_0"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=Path, required=True, help="dataset directory with responses.jsonl")
    ap.add_argument("--target", default="default")
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--train-steps", type=int, default=0, help="0: no training comparison")
    ap.add_argument("--work", type=Path, default=Path("runs/bench_capture_vllm"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.work.exists():
        shutil.rmtree(a.work)
    ours = _answers(a.answers, a.work / "in-process", a.samples)
    theirs = _answers(a.answers, a.work / "vllm", a.samples)
    res = {"samples": a.samples, "in_process": _extract(ours, a.target, "transformers"),
           "vllm": _extract(theirs, a.target, "vllm")}
    res["vllm_over_in_process_tok_s"] = res["vllm"]["tok_s"] / res["in_process"]["tok_s"]
    res["relative_error"] = _slot_errors(ours, theirs)
    print(f"capture tok/s: in process {res['in_process']['tok_s']:.0f}, vLLM {res['vllm']['tok_s']:.0f} "
          f"(ratio {res['vllm_over_in_process_tok_s']:.2f}; vLLM wall {res['vllm']['wall_s']:.0f} s incl. startup)")
    print(f"relative error per slot {[f'{e:.1e}' for e in res['relative_error']['features']]}, "
          f"final norm {res['relative_error']['target_hidden']:.1e}")
    if a.train_steps:
        res["val_acc_0"] = {"in_process_seed0": _train(ours, a.work / "train-hf", a.train_steps, 0),
                            "vllm_seed0": _train(theirs, a.work / "train-vllm", a.train_steps, 0),
                            "in_process_seed1": _train(ours, a.work / "train-hf-s1", a.train_steps, 1)}
        print("validation acc_0:", json.dumps(res["val_acc_0"]))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
