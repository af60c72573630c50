"""`eaglewire serve` for a DFlash drafter: vLLM's `dflash` method, checked against eaglewire's block decoding.

vLLM 0.32.0 serves a z-lab DFlash checkpoint with `--speculative-config
'{"method": "dflash", ...}'` (`config/speculative.py`; the V1 runner adds 1 to
`dflash_config.target_layer_ids` and captures through the EAGLE-3 aux path,
docs/parallel-drafters.md §2-3). It drafts K = `num_speculative_tokens` mask
slots in one forward every round, even when the request has fewer tokens left
than K + 1 (the scheduler does not shorten a draft for max_tokens), and counts
the round's accepted drafts up to the tokens the request kept, as it does for
EAGLE-3. The block engine counts the same way (decoding/dflash.py), so `doctor
live`'s DFlash prediction is the check: measured on vLLM 0.32 CPU
(tests/serve/test_vllm_dflash_serving.py), a prediction that drafts fewer near
the end misses one round and a few accepted drafts per 100.

SGLang (0.5.23, CUDA only) is printed, not started: `--speculative-algorithm
DFLASH` with `--speculative-num-draft-tokens` = K + 1, its verify window
(`arg_groups/speculative_hook.py` `_handle_dflash` forces num_steps and topk
to 1). llama.cpp is refused: `serve` checks llama-server's EAGLE-3 gate only.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from eaglewire.infra.errors import EaglewireError
from eaglewire.saved.depth import resolved_depth
from eaglewire.saved.dflash import is_dflash_checkpoint, read_dflash_config

__all__ = ["dflash_depth", "is_dflash_checkpoint", "refuse_engine", "sglang_command"]

METHOD = "dflash"  # vLLM's --speculative-config method for a z-lab DFlash checkpoint


def block_size(ckpt: Path) -> int:
    """The drafter's block size, from its config.json alone (the weights are the export's to read)."""
    return read_dflash_config(ckpt).block_size


def dflash_depth(depth: int, bsize: int) -> int:
    """Drafts per round: the block's B-1 mask slots unless --depth asks for fewer (0, the default, means the
    block's own); more than B-1 is one line, since no slot of the trained block drafts them."""
    depth = resolved_depth(depth, bsize - 1)
    if not 1 <= depth <= bsize - 1:
        raise EaglewireError(f"--depth {depth}: a DFlash drafter with block_size {bsize} drafts 1..{bsize - 1} "
                             "tokens per round (block_size - 1, vLLM num_speculative_tokens)")
    return depth


def refuse_engine(engine: str, ckpt: Path) -> None:
    """One line for an engine `serve` cannot start and check for a DFlash drafter."""
    if engine == "llama.cpp":
        raise EaglewireError(f"{ckpt}: a DFlash drafter; `serve --engine llama.cpp` starts and checks EAGLE-3 drafters "
                             "only: serve it with --engine vllm, or `eaglewire export --format gguf` and llama-server "
                             "yourself (unchecked)")
    if engine == "sglang":
        raise EaglewireError(f"{ckpt}: a DFlash drafter; SGLang's DFLASH runs on CUDA only: pass --print-command for "
                             "the serving machine, or --engine vllm to serve and check it here")


def sglang_command(target: str, drafter_dir: Path | str, depth: int, host: str, port: int, tp: int) -> str:
    """SGLang 0.5.23's launch line for a DFlash drafter (flags from `arg_groups/speculative_hook.py`)."""
    return shlex.join(["python", "-m", "sglang.launch_server", "--model-path", str(target),
                       "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter_dir),
                       "--speculative-num-draft-tokens", str(depth + 1), *(["--tp-size", str(tp)] if tp > 1 else []),
                       "--host", host, "--port", str(port)])
