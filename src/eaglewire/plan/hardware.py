"""The devices `plan` sizes for, how the engines split a target over them, and measured training rates.

A verdict is only as good as the device it compares with: `--device h200` names
the memory, peak and bandwidth of that part, and a bare `--device cuda` says
which part it assumed. Parallel sizes follow the engines' own rules, because a
plan that proposes a tensor-parallel size vLLM refuses to start is no plan:

* TP divides the attention heads (vLLM `ModelConfig.verify_with_parallel_config`;
  SGLang the same check), and the KV heads divide TP or TP divides them
  (vLLM `QKVParallelLinear` replicates KV heads only by a whole factor);
* EP: with `--enable-expert-parallel` (vLLM) / `--ep-size` (SGLang) the routed
  experts are spread over the TP group (EP = TP x DP, here DP 1), kept when the
  experts divide evenly;
* PP splits the layers; as both engines' multi-node guides recommend, TP stays
  inside a node (NVLink) and PP spans nodes.

Training time is never a flat fraction of a datasheet peak: it comes from a
measured throughput (this project's CPU figure, or a `benchmarks/gpu_check.py`
result passed with `--measured`), scaled by the drafter's matmul weights and TTT
steps; without one the GPU figure is marked unmeasured and given as the bound
the datasheet peak sets (real runs are slower).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eaglewire.infra.errors import EaglewireError

GIB = 1024 ** 3


@dataclass(frozen=True)
class Device:
    """Memory as the driver reports it (datasheet GB less the driver's reserve), dense bf16 peak, HBM bandwidth."""

    name: str
    memory_gib: float
    bf16_tflops: float
    bandwidth_gbs: float
    source: str


# Datasheet figures (NVIDIA H100/H200/HGX B200/A100 and AMD MI300X product pages); memory as nvidia-smi /
# torch.cuda report it (H200: the ~139.8 GiB torch reports on the lent H200 of this project's device check).
DEVICES = {d.name: d for d in (
    Device("h100", 79.6, 989.0, 3350.0, "H100 SXM 80 GB datasheet"),
    Device("h200", 139.8, 989.0, 4800.0, "H200 SXM 141 GB datasheet"),
    Device("b200", 178.0, 2250.0, 8000.0, "HGX B200 180 GB datasheet"),
    Device("a100", 79.2, 312.0, 2039.0, "A100 SXM 80 GB datasheet"),
    Device("a100-40gb", 39.4, 312.0, 1555.0, "A100 SXM 40 GB datasheet"),
    Device("l40s", 44.5, 362.0, 864.0, "L40S 48 GB datasheet"),
    Device("mi300x", 191.5, 1307.0, 5300.0, "MI300X 192 GB datasheet"),
)}
ASSUMED = "h100"  # a bare --device cuda: plan says it assumed this part and asks for the real one

# vLLM's --gpu-memory-utilization default (SGLang's --mem-fraction-static is set near it): the share of a
# device the engine takes; its weights, KV cache and activation peak must fit inside it.
ENGINE_MEMORY_UTILIZATION = 0.9
ACTIVATION_RESERVE_GIB = 2.0  # the engine's forward peak beside weights and cache (an assumption, printed)


def _tp_ok(tp: int, heads: int, kv_heads: int, mla: bool) -> bool:
    if heads % tp:
        return False
    if mla:  # MLA's latent cache is one "head", replicated on every TP rank
        return True
    return tp % kv_heads == 0 if tp >= kv_heads else kv_heads % tp == 0


def _per_device(s: dict, weights: int, kv: int, tp: int, pp: int) -> float:
    """Bytes on one device: its share of the weights and of the KV cache, plus the activation reserve."""
    kv_share = kv / pp if s.get("mla") else kv / (pp * min(tp, s["num_kv_heads"]))
    return weights / (tp * pp) + kv_share + ACTIVATION_RESERVE_GIB * GIB


def smallest_setup(s: dict, weights: int, kv: int, memory_bytes: float, gpus_per_node: int) -> dict | None:
    """The fewest devices the engines would serve the target on: the smallest valid TP inside one node,
    else a full node's TP times the fewest pipeline stages; None when one layer per stage still does not fit."""
    usable = memory_bytes * ENGINE_MEMORY_UTILIZATION
    tps = [t for t in range(1, gpus_per_node + 1) if _tp_ok(t, s["num_heads"], s["num_kv_heads"], s.get("mla", False))]
    pick = next(((t, 1) for t in tps if _per_device(s, weights, kv, t, 1) <= usable), None)
    if pick is None and tps:
        t = tps[-1]
        pick = next(((t, p) for p in range(2, s["num_layers"] + 1) if _per_device(s, weights, kv, t, p) <= usable), None)
    if pick is None:
        return None
    tp, pp = pick
    ep = tp if s["num_experts"] and s["num_experts"] % tp == 0 and tp > 1 else 1
    return {"tensor_parallel_size": tp, "expert_parallel_size": ep, "pipeline_parallel_size": pp,
            "devices": tp * pp, "nodes": -(-tp * pp // gpus_per_node) if pp > 1 else 1,
            "per_device_bytes": int(_per_device(s, weights, kv, tp, pp)), "usable_bytes_per_device": int(usable)}


def setup_line(p: dict | None) -> str:
    if p is None:
        return "no setup fits (one layer per stage on a full node still exceeds a device)"
    ep = f" x EP {p['expert_parallel_size']}" if p["expert_parallel_size"] > 1 else ""
    return (f"TP {p['tensor_parallel_size']}{ep} x PP {p['pipeline_parallel_size']} = {p['devices']} device(s), "
            f"{p['nodes']} node(s)")


def read_measured(path: Path) -> dict:
    """A `benchmarks/gpu_check.py` result: the measured bf16 training throughput and the drafter it ran."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EaglewireError(f"--measured {path}: not a readable gpu_check result ({e})") from None
    t = raw.get("train") if isinstance(raw, dict) else None
    keys = ("tokens_per_s", "matmul_parameters", "ttt_steps")
    if not isinstance(t, dict) or not all(isinstance(t.get(k), (int, float)) and t[k] > 0 for k in keys):
        raise EaglewireError(f"--measured {path}: expected a benchmarks/gpu_check.py result with train."
                             f"{', train.'.join(keys)} (positive numbers)")
    return {"device": str(raw.get("device", "?")), "tokens_per_s": float(t["tokens_per_s"]),
            "matmul_parameters": int(t["matmul_parameters"]), "ttt_steps": int(t["ttt_steps"]),
            "dtype": str(t.get("dtype", "bf16")), "source": str(path)}


def train_rate(d: dict, ttt_steps: int, freeze_head: bool, dev: Device, measured: dict | None) -> dict:
    """Training tokens/s of one device and its basis: measured (scaled by matmul weights and TTT steps), or the
    datasheet-peak bound marked unmeasured."""
    if measured is not None:
        rate = (measured["tokens_per_s"] * measured["matmul_parameters"] / d["matmul_parameters"]
                * measured["ttt_steps"] / ttt_steps)
        return {"tokens_per_s": rate, "basis": "measured", "lower_bound": False,
                "line": f"training: measured {measured['tokens_per_s']:,.0f} tok/s on {measured['device']} "
                        f"({measured['dtype']}, {measured['source']}), scaled by drafter matmul weights and TTT steps"}
    D, H = d["draft_vocab_size"], d["hidden_size"]
    frozen = D * H if freeze_head else 0
    flops = ttt_steps * (6 * (d["matmul_parameters"] - frozen) + 4 * frozen + 2 * D * H)
    return {"tokens_per_s": dev.bf16_tflops * 1e12 / flops, "basis": "unmeasured", "lower_bound": True,
            "line": f"training: UNMEASURED on {dev.name}; the time is a lower bound at the {dev.bf16_tflops:g} "
                    f"TFLOP/s datasheet peak (6 x drafter weights x TTT steps per token); run benchmarks/gpu_check.py "
                    "on the device and pass its result with --measured for a measured figure"}
