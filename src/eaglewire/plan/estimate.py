"""`eaglewire plan`: disk, memory and time of a drafter run, before spending GPU hours.

Everything is computed from the target's config (no weights loaded) and the
run's sizes. Two paths are compared: offline (generate answers, extract and
store features once, train from disk: pays disk, reads the target once) and
online (the target runs inside training every epoch: no feature store, but the
target's weights and the drafter share a device). Disk is exact arithmetic over
the shard layout of `data/extract.py` (tested against real shards); memory
and time are estimates from named constants, and every assumption is listed
in the output, because a plan that hides its assumptions cannot be checked.
"""

from __future__ import annotations

import dataclasses
import math
import os

from eaglewire.data.pipeline import auto_vocab_size
from eaglewire.infra.device import auto_device_type
from eaglewire.infra.errors import EaglewireError
from eaglewire.plan import hardware
from eaglewire.plan.config import GIB, TRAIN_DEFAULTS, PlanConfig
from eaglewire.plan.quant import quantization_config, scheme, weight_bytes
from eaglewire.plan.shape import drafter_shape, read_config_json, target_config, target_shape
from eaglewire.targets.points import point_option

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Shard layout (data/extract.py `_write_shard`): per token input_ids int32 + loss_mask uint8; per sample
# offsets int64 + sample_index int64; per shard one more offset and the safetensors JSON header (~0.6 kB).
TOKEN_FIXED_BYTES = 4 + 1
SAMPLE_FIXED_BYTES = 8 + 8
SHARD_FIXED_BYTES = 8 + 640
TEXT_BYTES_PER_TOKEN = 5.0  # prompts.jsonl + responses.jsonl: ~4 characters per token plus JSON (assumption)

# Measured on this project's 2-core CPU machine, fp32, default target (SmolLM2-135M, 134,515,008 parameters);
# README "Measured on the 2-core CPU machine" and benchmarks/README.md.
CPU_REF_PARAMS = 134_515_008
CPU_EXTRACT_TOK_S = 619.0  # benchmarks/bench_data.py: extraction (capture, no lm_head)
CPU_GEN_TOK_S = {1: 15.6, 16: 80.5, 64: 133.9}  # batched greedy generation (README), tokens/s by batch size
CPU_TRAIN_TOK_S = 288.0  # benchmarks/bench_train.py: TTT step, T=1024, 7 steps, draft vocab 8192
CPU_REF_DRAFTER_MATMUL = 9_805_824  # that drafter's fc + layer + lm_head weights (planshape.drafter_shape)
CPU_REF_TTT_STEPS = 7
MFU_PREFILL = 0.40  # extraction and prompt prefill: large matmuls
DECODE_BW_EFFICIENCY = 0.60  # share of peak HBM bandwidth a decode step reaches


def _points(cfg: PlanConfig, num_layers: int) -> list[str]:
    return [p.name for p in point_option(cfg.points, num_layers)]


def disk_estimate(H: int, num_points: int, dtype: str, tokens: int, samples: int, shard_samples: int) -> dict:
    """Shard bytes: P captured slots + target_hidden (the final norm) per token, as extract.py stores them."""
    per_token = TOKEN_FIXED_BYTES + (num_points + 1) * H * BYTES[dtype]
    shards = math.ceil(samples / shard_samples)
    total = tokens * per_token + samples * SAMPLE_FIXED_BYTES + shards * SHARD_FIXED_BYTES
    return {"bytes_per_token": per_token, "num_shards": shards, "shard_bytes": total}


def _disk(cfg, s: dict, d: dict, tokens: int) -> dict:
    feats = disk_estimate(s["hidden_size"], s["num_points"], cfg.store_dtype, tokens, cfg.samples, cfg.shard_samples)
    text = int(tokens * TEXT_BYTES_PER_TOKEN)
    ckpt = d["num_parameters"] * 4 + d["trainable_parameters"] * 12  # drafter/ fp32 + state/ (weights + Adam m, v)
    return {**feats, "text_bytes": text, "drafter_checkpoint_and_state_bytes": ckpt,
            "offline_total_bytes": feats["shard_bytes"] + text + ckpt, "online_total_bytes": text + ckpt}


def _device_memory(cfg, s: dict, d: dict, T: int) -> dict:
    """Bytes on one device per stage; training keeps the drafter in fp32 with AdamW."""
    wb = 2 if cfg.device == "cuda" else 4
    weights = s["weight_bytes"] if cfg.device == "cuda" else s["num_parameters"] * 4
    kv = s["kv_cache_layers"] * s["kv_values_per_token_per_layer"] * T * cfg.gen_batch_size * wb
    gen = weights + kv + cfg.gen_batch_size * s["vocab_size"] * 4
    act_I = s["active_intermediate"]
    extract_act = cfg.batch_tokens * ((s["num_points"] + 1) * s["hidden_size"] + 4 * s["hidden_size"] + 3 * act_I) * wb
    if cfg.device == "cpu":  # CPU SDPA materialises the scores: B x heads x T x T = batch_tokens x heads x T
        extract_act += cfg.batch_tokens * s["num_heads"] * T * 4
    H, D = s["hidden_size"], d["draft_vocab_size"]
    states = d["trainable_parameters"] * 16 + d["frozen_parameters"] * 4  # fp32 weights + grads + Adam m, v
    head_w = s["vocab_size"] * H * 4  # the target's lm_head in fp32, kept beside the drafter for q
    Tt = min(T, cfg.max_len)
    feats = cfg.batch_size * Tt * (s["num_points"] + 1) * H * 4
    acts = cfg.batch_size * Tt * cfg.ttt_steps * (12 * H + 3 * d["intermediate_size"] + 3 * D) * 4
    train = states + head_w + feats + acts
    cap = cfg.device_memory_gib * GIB

    def per_device(target_part: float, other: float = 0.0) -> float:
        """A stage that does not fit one device shards its target part over --gpus; the drafter is replicated."""
        return target_part + other if target_part + other <= cap or cfg.gpus == 1 else target_part / cfg.gpus + other

    return {"target_weights": weights, "generate_kv_cache": kv, "generate": per_device(gen),
            "extract": per_device(weights + extract_act), "extract_in_process": weights + extract_act,
            "generate_one_device": gen,
            "train_drafter": train,
            "online_train": per_device(weights + extract_act, train), "bytes_per_weight": wb}


def _host_memory(cfg, s: dict, d: dict, T: int, in_process: bool) -> dict:
    """Host bytes per rank and per node: every torchrun rank loads its own whole copy of the target.

    Extraction in process loads the target on the host before moving it to the device (in bf16 on
    cuda: the peak of that rank before the shard buffer fills; in fp32 on cpu, where it stays).
    Through vLLM one process drives the server and holds only the buffer. Training reads only the
    embedding, the lm_head and the fingerprint from the target's shards, never the whole target: a rank
    holds the drafter (its embedding is the target's) in fp32, AdamW's two moments, the target's lm_head
    in fp32 and one micro-batch of features.
    """
    cap = 2 if cfg.device == "cuda" else 4
    buf = cfg.shard_samples * T * (s["num_points"] + 1) * s["hidden_size"] * cap
    if not in_process:
        extract = buf
    elif cfg.device == "cpu":
        extract = s["num_parameters"] * 4 + buf
    else:
        extract = max(s["weight_bytes"], buf)
    batch = cfg.batch_size * min(T, cfg.max_len) * (s["num_points"] + 1) * s["hidden_size"] * BYTES[cfg.store_dtype]
    train = d["num_parameters"] * 4 + d["trainable_parameters"] * 8 + s["vocab_size"] * s["hidden_size"] * 4 + batch
    ranks = min(cfg.gpus, cfg.gpus_per_node)
    ext_procs = ranks if in_process else 1
    return {"per": "rank", "extract": extract, "extract_shard_buffer": buf, "train": train, "train_feature_batch": batch,
            "ranks_per_node": ranks, "extract_processes_per_node": ext_procs,
            "node_extract": ext_procs * extract, "node_train": ranks * train}


def host_ram_bytes() -> int | None:
    """This machine's RAM: on --device cpu the target, its activations and the drafter all live there."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:  # macOS and other systems without /proc
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _sized_memory(cfg: PlanConfig, dev: hardware.Device | None, assumed: bool) -> tuple[PlanConfig, str, str]:
    """`cfg` with the memory the fits verdicts compare with, where it came from, and the line saying so.

    On cpu the "device" is this machine: a laptop planning a CPU run must be told about its own RAM,
    not about an 80 GiB GPU it does not have. A bare --device cuda says which GPU it assumed.
    """
    if cfg.device_memory_gib > 0:
        return cfg, "--device-memory-gib", f"fits verdict: against --device-memory-gib {cfg.device_memory_gib:g} GiB per device"
    if dev is not None:
        src = "assumed" if assumed else "--device"
        line = (f"fits verdict: against {dev.memory_gib:g} GiB per device, ASSUMED an {dev.name.upper()} "
                f"({dev.source}); name yours: --device {'|'.join(hardware.DEVICES)} or --device-memory-gib"
                if assumed else f"fits verdict: against {dev.memory_gib:g} GiB per device ({dev.name.upper()}, {dev.source})")
        return dataclasses.replace(cfg, device_memory_gib=dev.memory_gib), src, line
    ram = host_ram_bytes()
    fallback = hardware.DEVICES[hardware.ASSUMED].memory_gib
    if ram is None:
        return (dataclasses.replace(cfg, device_memory_gib=fallback), "default",
                f"fits verdict: this machine's RAM is unknown; against {fallback:g} GiB (pass --device-memory-gib)")
    return (dataclasses.replace(cfg, device_memory_gib=ram / GIB), "host RAM",
            f"fits verdict: --device cpu runs in this machine's RAM, {ram / GIB:,.1f} GiB (--device-memory-gib overrides)")


def _interp_gen(batch: int) -> float:
    pts = sorted(CPU_GEN_TOK_S.items())
    if batch >= pts[-1][0]:
        return pts[-1][1]
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b0 <= batch <= b1:
            f = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return v0 + f * (v1 - v0)
    return pts[0][1]


def _cpu_rates(cfg, s: dict, d: dict) -> dict:
    scale = CPU_REF_PARAMS / s["active_parameters"]
    train = CPU_TRAIN_TOK_S * CPU_REF_DRAFTER_MATMUL / d["matmul_parameters"] * CPU_REF_TTT_STEPS / cfg.ttt_steps
    return {"generate": _interp_gen(cfg.gen_batch_size) * scale, "extract": CPU_EXTRACT_TOK_S * scale, "train": train,
            "prefill": CPU_EXTRACT_TOK_S * scale}


def _gpu_rates(cfg, s: dict, T: int) -> dict:
    """Generation and extraction on a GPU: not measured by this project (stated utilisations, printed)."""
    flops, bw = cfg.gpu_tflops * 1e12, cfg.gpu_bandwidth_gbs * 1e9
    # causal: ~T/2 keys per query, x 2 flops, over the score (QK) and value (PV) dims of each head
    attn = s["kv_cache_layers"] * T * s["num_heads"] * (s["qk_head_dim"] + s["v_head_dim"])
    prefill = flops * MFU_PREFILL / (2 * s["active_parameters"] + attn)
    B, ne, k = cfg.gen_batch_size, s["num_experts"], s["experts_per_token"]
    touched = 1 - (1 - k / ne) ** B if ne else 1.0  # share of routed experts a batch reads per step
    weight_bytes = s["weight_bytes"] - s["weight_groups"]["routed_experts"]["bytes"] * (1 - touched)
    kv_bytes = B * s["kv_cache_layers"] * s["kv_values_per_token_per_layer"] * (T / 2) * 2
    step = max((weight_bytes + kv_bytes) / (bw * DECODE_BW_EFFICIENCY),
               2 * s["active_parameters"] * B / (flops * MFU_PREFILL))
    return {"generate": B / step, "extract": prefill, "prefill": prefill}


def _times(cfg, s: dict, d: dict, tokens: int, new_total: int, T: int, train: dict | None) -> dict:
    r = _gpu_rates(cfg, s, T) if cfg.device == "cuda" else _cpu_rates(cfg, s, d)
    if train is not None:
        r["train"] = train["tokens_per_s"]
    n = cfg.gpus
    gen = new_total / r["generate"] / n + (tokens - new_total) / r["prefill"] / n
    ext = tokens / r["extract"] / n
    tr = cfg.epochs * cfg.samples * min(T, cfg.max_len) / r["train"] / n
    h = 3600.0
    return {"rates_tokens_per_s_per_device": {k: round(v, 1) for k, v in r.items()},
            "train_basis": train["basis"] if train else "measured", "train_is_lower_bound": bool(train and train["lower_bound"]),
            "offline": {"generate_h": gen / h, "extract_h": ext / h, "train_h": tr / h, "total_h": (gen + ext + tr) / h},
            "online": {"generate_h": gen / h, "target_forward_h": cfg.epochs * ext / h, "train_h": tr / h,
                       "total_h": (gen + cfg.epochs * ext + tr) / h},
            "device_hours": {"offline": (gen + ext + tr) * n / h, "online": (gen + cfg.epochs * ext + tr) * n / h}}


def _assumptions(cfg, s: dict) -> list[str]:
    a = [f"parameters: {s['method']}; fields read: {', '.join(s['fields_used'])}",
         s["quantization_note"] + (" (cuda; --device cpu sizes fp32)" if cfg.device == "cuda" else ""),
         f"disk: exact shard layout of data/extract.py ({s['num_points']} points + target_hidden x H x "
         f"{BYTES[cfg.store_dtype]} B + 5 B ids/mask per token); text ~{TEXT_BYTES_PER_TOKEN:g} B/token",
         f"generation: every conversation is generated to --new-tokens (no early EOS) at batch {cfg.gen_batch_size}, "
         "prompts prefilled once (a serving engine via `data generate --server` runs larger batches: raise --gen-batch-size)",
         "online path (`train --online`): the target forward is redone every epoch on the training device; "
         "answers are still generated first; training throughput itself is the same as offline",
         f"--gpus {cfg.gpus}: ideal linear scaling; device memory is per device: a full copy of the target when it "
         "fits one device, else the target sharded evenly over the devices; the drafter replicated",
         "training memory: fp32 drafter + AdamW, activations ~ batch x T x TTT steps x (12H + 3I + 3 draft vocab) x 4 B",
         f"training truncates samples to --max-len {cfg.max_len} tokens (train's default: {TRAIN_DEFAULTS['max_len']}): "
         f"of --seq-len {cfg.seq_len}, training sizes {min(cfg.seq_len, cfg.max_len)} tokens per sample; "
         f"--epochs {cfg.epochs} (train's default: {TRAIN_DEFAULTS['epochs']})",
         "host memory is per rank: extraction in process loads the whole target before moving it to the device; "
         "training reads only embedding, lm_head and fingerprint from the target (fp32 drafter + AdamW moments + "
         f"lm_head + one micro-batch of features); per node: x min(--gpus, --gpus-per-node) = "
         f"{min(cfg.gpus, cfg.gpus_per_node)} rank(s)",
         f"engine setup (vLLM/SGLang): TP divides the attention heads (and KV heads divide it or it them), EP = TP "
         f"for MoE, TP inside a node and PP across nodes; a device holds its weight share + KV of --gen-batch-size "
         f"sequences of --seq-len + {hardware.ACTIVATION_RESERVE_GIB:g} GiB activations within "
         f"{hardware.ENGINE_MEMORY_UTILIZATION:g} of its memory (vLLM's --gpu-memory-utilization default)"]
    if s["kv_cache_layers"] < s["num_layers"]:
        a.append(f"KV cache: {s['kv_cache_layers']} of {s['num_layers']} layers cache per token; the other "
                 "layers are linear attention, whose fixed-size state is not counted")
    if s["num_experts"]:
        a.append(f"MoE: {s['experts_per_token']} of {s['num_experts']} routed experts active per token "
                 f"({s['active_parameters']:,} active parameters)")
    if cfg.device == "cpu":
        a.append(f"CPU rates: measured on this project's 2-core CPU with the 135M default target (extract "
                 f"{CPU_EXTRACT_TOK_S:g}, generate {CPU_GEN_TOK_S[64]:g} at batch 64, train {CPU_TRAIN_TOK_S:g} tok/s), "
                 "scaled by active parameters (drafter: by its matmul weights and TTT steps)")
    else:
        a.append(f"CUDA generation/extraction rates are not measured: prefill = {cfg.gpu_tflops:g} TFLOP/s x "
                 f"{MFU_PREFILL} / (2 x active params + attention); decode = max(weight + KV bytes / "
                 f"({cfg.gpu_bandwidth_gbs:g} GB/s x {DECODE_BW_EFFICIENCY}), FLOPs)")
    return a


def _target_raw(cfg: PlanConfig) -> tuple[dict, str]:
    if cfg.hf_config is not None:
        return read_config_json(cfg.hf_config), str(cfg.hf_config)
    return target_config(cfg.target), cfg.target


def _fits(cfg, dev: dict, eng: dict, cap: float) -> dict:
    """Each stage against one device; a target stage sharded over --gpus fits when the engines' setup does
    (an even split that ignores TP's divisibility and the engine's memory share would say fits wrongly)."""
    out = {k: dev[k] <= cap for k in ("generate", "extract", "train_drafter", "online_train")}
    if cfg.device == "cuda" and cfg.gpus > 1:
        for k, whole in (("generate", dev["generate_one_device"]), ("extract", dev["extract_in_process"])):
            if whole > cap:
                out[k] = out[k] and eng["fits_gpus"]
    return out


def engine_setup(cfg, s: dict, T: int) -> dict:
    """The smallest TP/EP/PP the engines serve the target on, and whether --gpus provides it."""
    kv = s["kv_cache_layers"] * s["kv_values_per_token_per_layer"] * T * cfg.gen_batch_size * 2
    setup = hardware.smallest_setup(s, s["weight_bytes"], kv, cfg.device_memory_gib * GIB, cfg.gpus_per_node)
    fits = setup is not None and setup["devices"] <= cfg.gpus
    return {"setup": setup, "fits_gpus": fits, "gpus": cfg.gpus, "kv_cache_bytes": kv,
            "line": hardware.setup_line(setup)}


def capture_path(cfg, s: dict, dev: dict, eng: dict) -> dict:
    """Where feature capture fits: in process (one whole target per rank, under torchrun) or in vLLM over
    the smallest setup the engines would serve the target on."""
    cap = cfg.device_memory_gib * GIB
    if dev["extract_in_process"] <= cap:
        return {"path": "in process", "devices_needed": 1,
                "command": f"torchrun --nproc_per_node {cfg.gpus} -m eaglewire.cli data extract DATA --target T"}
    p = eng["setup"]
    if p is None:
        return {"path": "none", "devices_needed": None, "command": "no engine setup fits: " + eng["line"]}
    tp, pp, nodes = p["tensor_parallel_size"], p["pipeline_parallel_size"], p["nodes"]
    flags = f"--engine vllm --tensor-parallel-size {tp}"
    extra = ([f"--pipeline-parallel-size {pp}"] if pp > 1 else []) + (
        ["--enable-expert-parallel"] if p["expert_parallel_size"] > 1 else [])
    if extra:
        flags += f" --engine-args '{' '.join(extra)}'"
    out = {"path": "vllm" if nodes == 1 else "vllm multi-node", "devices_needed": p["devices"],
           "tensor_parallel_size": tp, "expert_parallel_size": p["expert_parallel_size"],
           "pipeline_parallel_size": pp, "nodes": nodes, "command": f"eaglewire data extract DATA --target T {flags}"}
    if nodes > 1:
        out["command"] += (f" --print-command  # then start it on {nodes} nodes (vLLM --nnodes {nodes} "
                           "--node-rank R --master-addr HEAD, --headless on R > 0) and pass --engine-url")
    return out


def _sized_device(cfg: PlanConfig) -> tuple[PlanConfig, str | None, hardware.Device | None, bool]:
    """`cfg` with --device as cpu or cuda (and its peaks), the line saying what auto picked (None when
    given), the named GPU (None on cpu) and whether that GPU was assumed rather than named.

    Resolved like every other command's auto, but never checked against this machine: a CPU box
    plans a GPU cluster with --device h200.
    """
    note = None
    if cfg.device == "auto":
        kind = auto_device_type()
        why = "a GPU is visible here" if kind == "cuda" else "no GPU here; --device h200 (or another GPU) sizes a GPU run"
        cfg, note = dataclasses.replace(cfg, device=kind), f"--device auto: sized for {kind} ({why})"
    if cfg.device == "cpu":
        return cfg, note, None, False
    assumed = cfg.device == "cuda"
    dev = hardware.DEVICES[hardware.ASSUMED if assumed else cfg.device]
    cfg = dataclasses.replace(cfg, device="cuda", gpu_tflops=cfg.gpu_tflops or dev.bf16_tflops,
                              gpu_bandwidth_gbs=cfg.gpu_bandwidth_gbs or dev.bandwidth_gbs)
    return cfg, note, dev, assumed


def _target_weights(cfg: PlanConfig) -> tuple[dict, str, dict, dict, dict]:
    """(config, where it was read, shape, quantization scheme, weight bytes) of the target sized."""
    raw, src = _target_raw(cfg)
    s = target_shape(raw, src)
    sch = scheme(quantization_config(raw))
    return raw, src, s, sch, weight_bytes(s, sch)


def serving_setup(cfg: PlanConfig) -> dict:
    """`engine_setup` of the target on --device as `plan` sizes it, without the rest of the plan: what
    `serve --print-command` takes its tensor-parallel size from, so the two commands cannot disagree."""
    cfg, _, gpu, assumed = _sized_device(cfg)
    cfg, _, _ = _sized_memory(cfg, gpu, assumed)
    _, _, s, _, wb = _target_weights(cfg)
    return engine_setup(cfg, {**s, "weight_bytes": wb["total_bytes"]}, cfg.seq_len)


def plan(cfg: PlanConfig) -> dict:
    cfg, auto_note, gpu, assumed = _sized_device(cfg)
    cfg, memory_source, memory_note = _sized_memory(cfg, gpu, assumed)
    raw, src, s, sch, wb = _target_weights(cfg)
    names = _points(cfg, s["num_layers"])
    ne, k = s["num_experts"], s["experts_per_token"]
    s.update(num_points=len(names), points=names, weight_bytes=wb["total_bytes"], weight_groups=wb["groups"],
             quantization=wb["scheme"], quantization_note=sch["note"],
             active_intermediate=s.get("expert_intermediate_size", 0) * k if ne else s["intermediate_size"])
    D = min(cfg.vocab_size or auto_vocab_size(s["vocab_size"]), s["vocab_size"])
    d = drafter_shape(raw, len(names), D, cfg.freeze_head, cfg.intermediate_size)
    T = cfg.seq_len
    new = cfg.new_tokens or max(1, T * 3 // 4)
    if new > T:
        raise EaglewireError(f"--new-tokens {new}: more than --seq-len {T}")
    measured = hardware.read_measured(cfg.measured) if cfg.measured is not None else None
    train = hardware.train_rate(d, cfg.ttt_steps, cfg.freeze_head, gpu, measured) if gpu else None
    tokens = cfg.samples * T
    dev = _device_memory(cfg, s, d, T)
    cap = cfg.device_memory_gib * GIB
    eng = engine_setup(cfg, s, T)
    capture = capture_path(cfg, s, dev, eng)
    notes = ([auto_note] if auto_note else []) + [memory_note] + _assumptions(cfg, s) + ([train["line"]] if train else [])
    return {"source": src, "estimate": True, "target": {k: v for k, v in s.items() if k != "fields_used"},
            "drafter": d, "run": {"samples": cfg.samples, "seq_len": T, "new_tokens": new, "tokens": tokens,
                                  "max_len": cfg.max_len, "train_tokens_per_epoch": cfg.samples * min(T, cfg.max_len),
                                  "store_dtype": cfg.store_dtype, "device_type": cfg.device, "gpus": cfg.gpus,
                                  "device_name": gpu.name if gpu else "cpu", "device_assumed": assumed,
                                  "epochs": cfg.epochs, "device_memory_bytes": cap,
                                  "device_memory_source": memory_source},
            "disk": _disk(cfg, s, d, tokens), "device_memory": dev,
            "host_memory": _host_memory(cfg, s, d, T, capture["path"] == "in process"),
            "fits_one_device": _fits(cfg, dev, eng, cap),
            "engine": eng, "capture": capture, "time": _times(cfg, s, d, tokens, cfg.samples * new, T, train),
            "assumptions": notes}
