"""`eaglewire plan`: registers the command and prints its table; the estimate is :mod:`eaglewire.plan.estimate`."""

from __future__ import annotations

from eaglewire.infra.options import build_command
from eaglewire.infra.output import emit
from eaglewire.plan.config import GIB, PlanConfig


def _gib(b: float) -> str:
    return f"{b / GIB:,.2f} GiB" if b < 1024 * GIB else f"{b / 1024 ** 4:,.2f} TiB"


def _duration(hours: float) -> str:
    """Hours as a person reads them: 9.4 h, 12 min, 3 s, not 6.12e-07."""
    if hours >= 100:
        return f"{hours:,.0f} h"
    if hours >= 1:
        return f"{hours:,.3g} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.3g} min"
    return f"{hours * 3600:.0f} s" if hours * 3600 >= 1 else "< 1 s"


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _print(r: dict) -> None:
    t, run, dk, dm, hm, tm = r["target"], r["run"], r["disk"], r["device_memory"], r["host_memory"], r["time"]
    active = f" ({t['active_parameters']:,} active)" if t["num_experts"] else ""
    print(f"target {r['source']}: {t['num_parameters']:,} parameters{active}, {t['num_layers']} layers, "
          f"H={t['hidden_size']}, vocab {t['vocab_size']:,} [{t['method']}]")
    where = run["device_name"].upper() + (" (ASSUMED)" if run["device_assumed"] else "")
    print(f"run: {run['samples']:,} samples x {run['seq_len']} tokens = {run['tokens']:,} tokens, points "
          f"{', '.join(t['points'])}, features in {run['store_dtype']}, {where} x {run['gpus']}  (estimates)")
    fits, eng = r["fits_one_device"], r["engine"]
    need = eng["setup"]["devices"] if eng["setup"] else "more"
    cuda = run["device_type"] == "cuda"
    rows = [("target weights", _gib(t["weight_bytes"] if cuda else t["num_parameters"] * 4),
             t["quantization"] if cuda else "fp32 on cpu")]
    if cuda:  # the engines serve on GPUs; a CPU run's verdict is its RAM's
        rows.append((f"engine (vLLM/SGLang) for --gpus {eng['gpus']}", eng["line"].split(",")[0].split(" = ")[0],
                     "fits" if eng["fits_gpus"] else f"DOES NOT FIT on --gpus {eng['gpus']}: needs {need}, {eng['line']}"))
    rows += [("disk: feature shards", _gib(dk["shard_bytes"]), f"{dk['bytes_per_token']:,} B/token"),
            ("disk: offline total / online total", f"{_gib(dk['offline_total_bytes'])} / {_gib(dk['online_total_bytes'])}", ""),
            ("device: memory the verdicts compare with", _gib(run["device_memory_bytes"]),
             "this machine's RAM" if run["device_memory_source"] == "host RAM" else "per device"),
            ("device: generate (weights + KV)", _gib(dm["generate"]), "fits" if fits["generate"] else "DOES NOT FIT"),
            ("device: extract", _gib(dm["extract"]), "fits" if fits["extract"] else "DOES NOT FIT"),
            ("device: train drafter (offline)", _gib(dm["train_drafter"]), "fits" if fits["train_drafter"] else "DOES NOT FIT"),
            ("device: online (target + drafter)", _gib(dm["online_train"]), "fits" if fits["online_train"] else "DOES NOT FIT"),
            ("host per rank: extract / train", f"{_gib(hm['extract'])} / {_gib(hm['train'])}",
             "train: drafter + AdamW + lm_head + a batch (not the target)"),
            (f"host per node ({_ranks(hm['ranks_per_node'])}): extract / train",
             f"{_gib(hm['node_extract'])} / {_gib(hm['node_train'])}",
             "" if hm["extract_processes_per_node"] == hm["ranks_per_node"] else "extract: one process drives vLLM")]
    cp = r["capture"]
    where = "one whole target per device" if cp["path"] in ("in process", "none") else (
        f"{cp['devices_needed']} devices: TP {cp['tensor_parallel_size']}, EP {cp['expert_parallel_size']}, "
        f"PP {cp['pipeline_parallel_size']} over {cp['nodes']} node(s)")
    rows.append(("capture path", cp["path"], where))
    bound = ">= " if tm["train_is_lower_bound"] else ""
    for what, path in (("offline", tm["offline"]), ("online", tm["online"])):
        parts = ", ".join(f"{k[:-2]} {bound if k == 'train_h' else ''}{_duration(v)}"
                          for k, v in path.items() if k != "total_h")
        rows.append((f"time: {what} (wall)", bound + _duration(path["total_h"]),
                     parts + ("  (train UNMEASURED: a peak-FLOP bound)" if bound else "")))
    for a, b, c in rows:
        print(f"  {a:<42}{b:>22}  {c}")
    print("assumptions:")
    for a in r["assumptions"]:
        print(f"  - {a}")
    print(f"capture: {cp['command']}")


def run_plan(cfg: PlanConfig) -> dict:
    from eaglewire.plan.estimate import (
        plan,  # lazy: it reads transformers' configs, `--help` must not
    )

    res = plan(cfg)
    emit(res, cfg.json, _print)
    return res


def register(app) -> None:
    build_command(app, "plan", PlanConfig, run_plan,
                  "Estimate disk, memory and time of the offline and online paths from the target's config (no weights).")
