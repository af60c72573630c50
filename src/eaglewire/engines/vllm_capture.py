"""Target features captured by vLLM: the engine that holds targets no single device can.

vLLM 0.32 runs a target with the `extract_hidden_states` speculative method
and a KV connector that writes, per request, the residual stream at
`eagle_aux_hidden_state_layer_ids` for every prompt token to
`<states dir>/<request id>.safetensors` (`hidden_states` [T, K, H] in the
sorted order of the ids, `token_ids` [T]) and returns that path in the reply's
`kv_transfer_params`. A vLLM id i is the input of decoder layer i, so the ids
come from `points.ids_for_points(..., "vllm")` and nowhere else.

On vLLM's CPU build the upstream connector fails on its first finished
request (it pins host memory and polls CUDA events), so a managed server
loads eaglewire's `CpuHiddenStatesConnector` (engines/vllm_plugin/), which
gathers synchronously and writes the same files. A server the user started
elsewhere may use either connector: this client reads both.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from eaglewire.engines.http import ChatClient, RequestFailed
from eaglewire.infra.errors import EaglewireError
from eaglewire.infra.paths import is_within

PLUGIN_DIR = Path(__file__).parent / "vllm_plugin"
CONNECTOR = "CpuHiddenStatesConnector"
CONNECTOR_MODULE = "eaglewire_hidden_states"
UPSTREAM_CONNECTOR = "ExampleHiddenStatesConnector"


def capture_args(ids: list[int], states_dir: Path, ours: bool = True) -> list[str]:
    """vLLM server flags that make it a feature extractor for `ids` (vLLM's meaning)."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}}}
    kv = {"kv_connector": CONNECTOR if ours else UPSTREAM_CONNECTOR, "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(states_dir)}}
    if ours:
        kv["kv_connector_module_path"] = CONNECTOR_MODULE
    # vLLM's docs: chunked prefill is not supported by this method. Without prefix caching
    # every token's states are computed by this request's own forward.
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--no-enable-chunked-prefill", "--no-enable-prefix-caching"]


def plugin_env() -> dict[str, str]:
    """The environment that lets a vLLM process import eaglewire's connector (and nothing else of eaglewire)."""
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(PLUGIN_DIR) + (os.pathsep + path if path else "")}


def states_file(path: object, states_dir: Path, where: str) -> str:
    """The reply's `hidden_states_path` when it names a plain safetensors file inside `states_dir`; else one line.

    Checked before the file is read or removed: a reply naming any other file
    would otherwise have us load it and delete it (and its `.lock`).
    """
    p = Path(path) if isinstance(path, str) else None
    if p is None or not p.is_absolute() or p.suffix != ".safetensors":
        raise EaglewireError(f"{where}: kv_transfer_params.hidden_states_path {path!r} is not an absolute path "
                             f"to a .safetensors file in the states directory {states_dir}")
    if p.is_symlink() or not is_within(p, states_dir):
        raise EaglewireError(f"{where}: kv_transfer_params.hidden_states_path {path!r} is outside the states "
                             f"directory {states_dir} the server was given; refused (nothing read or removed)")
    return str(p)


def read_states(path: str, where: str) -> dict[str, torch.Tensor]:
    """The connector's file, once its writer released the companion lock; both files are removed after.

    `path` must have passed :func:`states_file`: it is deleted.
    """
    lock = path + ".lock"
    try:
        if os.path.exists(lock):
            with open(lock) as lf:
                fcntl.flock(lf, fcntl.LOCK_SH)  # sleeps until the writer's exclusive lock is released
        data = load_file(path)
    except FileNotFoundError as e:
        raise EaglewireError(f"{where}: the server wrote {path}, which this machine cannot read; "
                             "give the server a --states-dir both machines share") from e
    except (OSError, ValueError) as e:
        raise EaglewireError(f"{where}: {path}: cannot read the captured states ({e})") from e
    for p in (path, lock):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return data


class StatesClient:
    """Ask a capture server for one token sequence's states: [T, K, H], columns in sorted-id order."""

    def __init__(self, url: str, model: str | None, num_ids: int, hidden_size: int, timeout_s: float = 600.0, *,
                 states_dir: Path):
        self.states_dir = Path(states_dir)  # the server's files must lie here: only they are read and removed
        self.client = ChatClient(url, timeout_s=timeout_s, retries=2, backoff_s=1.0)
        self.model = model or self.client.identity(None)["model"]
        self.num_ids, self.hidden_size = num_ids, hidden_size

    def states(self, ids: list[int]) -> torch.Tensor:
        body = {"model": self.model, "prompt": list(ids), "max_tokens": 1, "temperature": 0}
        where = f"{self.client.base}/v1/completions"
        try:
            reply = self.client.request("/v1/completions", body)[0]
        except RequestFailed as e:
            raise EaglewireError(str(e) if where in str(e) else f"{where}: {e}") from e
        path = (reply.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not isinstance(path, str):
            raise EaglewireError(f"{where}: the reply has no kv_transfer_params.hidden_states_path; start vLLM "
                                 "with the capture flags `eaglewire data extract --engine vllm --print-command` prints")
        data = read_states(states_file(path, self.states_dir, where), where)
        hs, tok = data.get("hidden_states"), data.get("token_ids")
        if hs is None or tok is None or tuple(hs.shape) != (len(ids), self.num_ids, self.hidden_size):
            shape = None if hs is None else list(hs.shape)
            raise EaglewireError(f"{path}: hidden_states {shape}, expected [{len(ids)}, {self.num_ids}, "
                                 f"{self.hidden_size}] (is the server capturing other layer ids?)")
        if tok.tolist() != list(ids):
            raise EaglewireError(f"{path}: the server captured other tokens than were sent "
                                 f"(first difference at position {_first_diff(tok.tolist(), ids)})")
        return hs  # [T, K, H]


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
