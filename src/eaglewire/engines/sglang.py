"""SGLang's launch command for an EAGLE-3 drafter: eaglewire prints it (SGLang runs on CUDA, not here).

The flag names are SGLang's own (`sglang/srt/server_args.py`, checked against the
pinned wheel's source by the tests). A chain of `depth` drafts is `topk` 1 with
`depth` steps and `depth + 1` tokens per verify (the root included).
"""

from __future__ import annotations

import shlex
from pathlib import Path


def launch_command(target: str, drafter_dir: Path | str, steps: int, topk: int = 1, draft_tokens: int = 0,
                   host: str = "127.0.0.1", port: int = 30000) -> list[str]:
    """`python -m sglang.launch_server ...` serving `target` with the exported drafter at `drafter_dir`."""
    return ["python", "-m", "sglang.launch_server", "--model-path", str(target), "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(drafter_dir), "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens or steps + 1),
            "--host", host, "--port", str(port)]


def launch_line(*args, **kwargs) -> str:
    return shlex.join(launch_command(*args, **kwargs))
