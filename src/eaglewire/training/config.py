"""The options of `eaglewire train`: one typed config, kept free of torch so `--help` stays fast."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from eaglewire.data.config import ExtractSettings
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.options import flag_of, opt
from eaglewire.infra.output import json_flag
from eaglewire.saved.depth import DEPTH
from eaglewire.targets.points import POINTS_HELP

# the warm-start levels of eaglewire.drafter.warmstart (named here: that module loads torch)
INITS = ("random", "head", "target")
# Sizes are bounded before anything is allocated (one line naming the flag, never an allocator traceback).
PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL = ("ddp", "fsdp")
# The drafter's own bounds (drafter/config.py BOUNDS, restated here: importing it loads torch; a test keeps
# them equal), and a TTT unroll far past any published one (EAGLE-3 trains 7 steps).
MAX_DRAFTER_LAYERS = 64
MAX_WIDTH = 10**7
MAX_TTT_STEPS = 64
MAX_SEED = 2**32 - 1  # the seed is scaled into torch generator seeds (64 bits)
MAX_BATCH = 10**6
MAX_LEN = 10**9  # the drafter's max_position_embeddings bound
DRAFTERS = ("eagle3", "dflash", "p-eagle")
ENGINES = ("transformers", "vllm")  # what runs the target for --online (data extract's --engine names)
# options only a vLLM capture reads: set with --engine transformers, they are refused
VLLM_ONLY = ("engine_url", "states_dir", "tensor_parallel_size", "engine_args", "vllm_python", "startup_timeout",
             "request_timeout")
MAX_ANCHORS = 4096  # DFlash: the dense block mask is (N*B) x (T+N*B) per sequence and head
# options one drafter reads and the other does not: set away from their default with the other, they are refused
EAGLE3_ONLY = ("ttt_steps", "ttt_decay", "target_temperature", "lk_weight", "vocab_size", "feature_noise",
               "norm_before_residual", "fc_norm", "norm_before_fc", "norm_output", "init", "fc_mix", "freeze_head",
               "select", "select_depth")
DFLASH_ONLY = ("block_size", "mask_token_id", "num_anchors", "loss_decay_gamma")
# P-EAGLE is an EAGLE-3 drafter (its structure options apply) trained without a TTT unroll or its target shaping
# (peagle_loss.py: speculators' plain KL), and with a mask token as DFlash's slots have
PEAGLE_READS = (*(n for n in EAGLE3_ONLY if n not in ("ttt_steps", "ttt_decay", "target_temperature", "lk_weight",
                                                      "select_depth")), "mask_token_id", "parallel_depths")
READS = {"eagle3": EAGLE3_ONLY, "dflash": DFLASH_ONLY, "p-eagle": PEAGLE_READS}


@dataclass
class TrainConfig:
    data: Path = opt(help="dataset directory (eaglewire data build; with --online, data generate)")
    out: Path = opt(help="run directory: drafter/ (the checkpoint), state/, metrics.csv, tb/")
    drafter: str = opt("eagle3", "drafter to train: eagle3 (one token per step, training-time test), dflash "
                       "(a block of --block-size - 1 tokens per step, KV injection of the capture points; the "
                       "dataset's points, all layers.k.out ascending, become its target_layer_ids) or p-eagle (an "
                       "EAGLE-3 drafter drafting its --parallel-depths positions in one forward, as vLLM's "
                       "parallel_drafting serves it)", choices=DRAFTERS)
    target: str = opt("", "target; default: the one recorded in the dataset manifest (must match its fingerprint), "
                      "with --online the one generate.config.json records")
    online: bool = opt(False, "run the target inside the loop on --data's responses.jsonl: no feature shards read or stored")
    points: list[str] = opt(help="--online: capture points (repeat or comma-separate): " + POINTS_HELP,
                            factory=list)
    store_dtype: str = opt(ExtractSettings.dtype, "--online: round features to this dtype, as `data extract "
                           "--store-dtype` stores them (same losses as offline)", choices=("fp32", "bf16", "fp16"))
    dtype: str = opt("auto", "--online: target compute dtype (auto: bf16 on CUDA, fp32 on CPU)",
                     choices=("auto", "fp32", "bf16", "fp16"))
    engine: str = opt("transformers", "--online: what runs the target: transformers (in this process) or vllm (a "
                      "vLLM capture server holds it, tensor/expert parallel, and answers each micro-batch's features; "
                      "the trainer reads only the embedding and head)", choices=ENGINES)
    engine_url: str | None = opt(None, "--engine vllm: a capture server you started (the command `eaglewire data "
                                 "extract --engine vllm --print-command` prints; every torchrun rank asks it); "
                                 "default: eaglewire starts and stops one")
    states_dir: Path | None = opt(None, "--engine vllm: where the server writes each request's states, a directory "
                                  "this machine reads too (default: <out>/.vllm-states for a server eaglewire starts, "
                                  "<data>/.vllm-states, as --print-command gives it, with --engine-url)")
    tensor_parallel_size: int = opt(1, "--engine vllm: vLLM --tensor-parallel-size", ge=1)
    engine_args: str = opt("", "--engine vllm: more vLLM server flags, e.g. '--enable-expert-parallel'")
    vllm_python: str = opt("", "--engine vllm: Python of a vLLM install; default: `vllm` on PATH, else a pinned CPU "
                           "venv eaglewire builds once")
    startup_timeout: int = opt(1800, "--engine vllm: seconds to wait for the server to become healthy", ge=10)
    request_timeout: float = opt(600.0, "--engine vllm: seconds one capture request may take in all", gt=0)
    vocab_size: int = opt(0, "--online without vocab.safetensors in --data: draft vocab size, counted over the "
                          "responses as `data vocab` does (0 = auto)", ge=0, le=MAX_WIDTH)
    max_steps: int = opt(0, "optimizer steps; 0 = --epochs full passes", ge=0)
    epochs: int = opt(1, "passes over the training split when --max-steps is 0", ge=1)
    batch_size: int = opt(4, "samples per micro-batch per process", ge=1, le=MAX_BATCH)
    grad_accum: int = opt(1, "micro-batches per optimizer step", ge=1, le=MAX_BATCH)
    lr: float = opt(3e-4, "peak learning rate (AdamW)", gt=0, le=1)
    min_lr_ratio: float = opt(0.1, "cosine floor as a fraction of --lr", ge=0, le=1)
    warmup_steps: int = opt(20, "linear warmup steps", ge=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = opt(0.95, "AdamW beta2 (EAGLE-3 paper: 0.95)", ge=0, lt=1)
    grad_clip: float = opt(0.5, "max gradient norm (EAGLE-3 paper: 0.5)", gt=0)
    ttt_steps: int = opt(7, "unrolled training-time-test steps", ge=1, le=MAX_TTT_STEPS)
    ttt_decay: float = opt(0.8, "weight of step k is decay**k", gt=0, le=1)
    target_temperature: float = opt(1.0, "temperature of the target distribution the drafter learns "
                                    "(1 = forward KL to q; 0 = one-hot on the target's argmax)", ge=0)
    lk_weight: float = opt(0.0, "weight of the LK loss -log(sum min(p, q)) added to the KL (acceptance-aware, "
                           "arXiv 2602.23881); 0 = KL only", ge=0)
    max_len: int = opt(2048, "samples are truncated to this many tokens (2048: what `data` and `plan` size a "
                       "sample to, so no stored feature goes untrained)", ge=3, le=MAX_LEN)
    val_fraction: float = opt(0.05, "share of samples held out for validation", ge=0, lt=1)
    seed: int = opt(0, "seed for init, split and order", ge=0, le=MAX_SEED)
    num_layers: int = opt(1, "drafter decoder layers (vLLM serves more than one; SGLang one)", ge=1,
                         le=MAX_DRAFTER_LAYERS)
    intermediate_size: int = opt(0, "drafter MLP width; 0 = the target's intermediate_size (both engines read it "
                                 "from the exported config)", ge=0, le=MAX_WIDTH)
    feature_noise: float = opt(0.0, "training only: add uniform noise of +-this fraction of each token's per-slot "
                               "RMS to the target features (EAGLE's feature noise, made scale-free); 0 = off", ge=0)
    max_train_samples: int = opt(0, "train on a seeded subset of this many training-split samples (learning "
                                 "curves; the validation split is unchanged); 0 = all", ge=0)
    norm_before_residual: bool = opt(False, "residual taken after hidden_norm (some released checkpoints)")
    fc_norm: bool = opt(False, "per-slot RMSNorm on the fc input")
    norm_before_fc: bool = opt(False, "one RMSNorm over the whole fc input (speculators' default; vLLM serves it)")
    norm_output: bool = opt(False, "feed the final-normed hidden back to the next draft step (post-norm recursion, "
                            "EAGLE-3.1; vLLM serves it)")
    init: str = opt("random", "drafter init: random, head (lm_head rows + final norm from the target), "
                    "target (head + the decoder layer after the deepest captured point, fc selecting that slot)",
                    choices=INITS)
    fc_mix: float = opt(0.0, "--init target: random fc weights on the other slots, each adding this fraction of the "
                        "deepest slot's RMS at init (0 = the drafter starts on the deepest slot alone)", ge=0)
    freeze_head: bool = opt(False, "keep lm_head fixed (use with --init head/target): fewer trained weights, faster steps")
    select: str = opt("last", "which weights become drafter/: last (the final step), loss (the lowest validation "
                      "loss, as speculators keeps), acceptance (the highest validation mean acceptance length at "
                      "--select-depth, as SpecForge keeps); scored at every validation", choices=("last", "loss", "acceptance"))
    select_depth: int = opt(3, "--select acceptance: chain depth of the validation walk", ge=1, le=16)
    eval_every: int = opt(0, "validate every N steps (0 = at the end of each epoch and of training)", ge=0)
    save_every: int = opt(50, "save resumable state every N steps", ge=1)
    log_every: int = opt(1, "write a metrics row every N steps", ge=1)
    nan_policy: str = opt("skip", "non-finite batch: skip (counted) or stop (error naming the step)", choices=("skip", "stop"))
    max_skipped_fraction: float = opt(0.05, "fail the run when more than this share of its steps were skipped", ge=0, le=1)
    device: str = opt("auto", "auto, cpu, cuda, cuda:N (torchrun: cuda:LOCAL_RANK)")
    precision: str = opt("auto", "drafter compute: fp32, or bf16 autocast with fp32 master weights and optimizer "
                         "state; auto = bf16 (and TF32 matmuls) on CUDA, fp32 on CPU", choices=PRECISIONS)
    parallel: str = opt("ddp", "under torchrun: ddp (every rank holds the whole drafter, frozen embedding included) "
                        "or fsdp (FSDP2: weights, gradients and optimizer state sharded over the ranks); "
                        "checkpoints are whole either way, so a run resumes under the other", choices=PARALLEL)
    block_size: int = opt(4, "--drafter dflash: block size B (drafts B-1 tokens per round). 4 = 3 drafts, the depth "
                          "our CPU serving and the depth-3 doctor checks run; z-lab serves 16 on GPUs", ge=2, le=1024)
    mask_token_id: int = opt(-1, "--drafter dflash or p-eagle: the token id of the masked slots (a row of the target's "
                             "embedding); -1 = the tokenizer's mask token, else the first embedding row past the "
                             "tokenizer, else the highest special (then any) token id absent from the data "
                             "(recorded in train.config.json with why)", ge=-1, le=MAX_WIDTH)
    num_anchors: int = opt(64, "--drafter dflash: blocks per sequence per step (anchors drawn anew each step; "
                           "SpecForge: 512 on GPUs)", ge=1, le=MAX_ANCHORS)
    loss_decay_gamma: float = opt(0.0, "--drafter dflash: slot k weighs exp(-(k-1)/gamma); 0 = the paper's gamma "
                                  "(7 at B=16, 4 at B=8, 1+3B/8 otherwise)", ge=0)
    parallel_depths: int = opt(DEPTH, "--drafter p-eagle: draft positions K trained (depth 0 reads the target's "
                               "features, depths 1..K-1 mask slots) and recorded in the checkpoint; serve it with "
                               "num_speculative_tokens K", ge=1, le=MAX_TTT_STEPS)
    resume: bool = opt(False, "continue from --out/state")
    json: bool = json_flag("print the final metrics as JSON")


def check_drafter_options(cfg: TrainConfig) -> str:
    """`cfg.drafter`, once no option only other drafters read is set away from its default (never silently ignored)."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    check_engine_options(cfg, fields)
    for name in dict.fromkeys(n for names in READS.values() for n in names):
        if name not in READS[cfg.drafter] and getattr(cfg, name) != fields[name].default:
            readers = " or ".join(d for d in DRAFTERS if name in READS[d])
            raise EaglewireError(f"{flag_of(fields[name])} {getattr(cfg, name)!r}: applies to --drafter {readers} only, "
                                 f"not --drafter {cfg.drafter} (leave it at its default {fields[name].default!r})")
    if cfg.drafter == "p-eagle" and cfg.select == "acceptance":
        raise EaglewireError("--select acceptance: its validation walk drafts EAGLE-3's sequential chain, not "
                             "P-EAGLE's parallel slots; use --select loss or last with --drafter p-eagle")
    return cfg.drafter


def check_engine_options(cfg: TrainConfig, fields: dict) -> None:
    """`--engine vllm` with what it needs (--online; a drafter its capture session serves), and its options only
    with it."""
    if cfg.engine == "vllm" and not cfg.online:
        raise EaglewireError("--engine vllm: applies to --online only (offline training reads stored features; "
                             "capture them with `eaglewire data extract --engine vllm`)")
    if cfg.engine == "vllm" and cfg.drafter == "dflash":
        raise EaglewireError("--engine vllm: not supported with --drafter dflash yet (its loop holds no capture "
                             "server); capture with `eaglewire data extract --engine vllm` and train offline")
    if cfg.engine != "vllm":
        for name in VLLM_ONLY:
            if getattr(cfg, name) != fields[name].default:
                raise EaglewireError(f"{flag_of(fields[name])} {getattr(cfg, name)!r}: applies to --online --engine "
                                     "vllm only")
