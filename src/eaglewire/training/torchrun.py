"""torchrun awareness for training: rank/world from the environment, DDP for the gradients.

Gradients are averaged by `torch.nn.parallel.DistributedDataParallel`
(bucketed all-reduce overlapped with the backward) rather than a hand-written
all-reduce per parameter: same result (the equivalence test against one
process still holds), and the reduction of early buckets runs while later
layers are still differentiating. gloo on CPU, nccl on CUDA with each rank on
`cuda:LOCAL_RANK`.

DDP synchronises only gradients produced by a forward that went through it,
and TTT drives the drafter through its methods (`project`, `step_ttt`,
`logits`), not its `forward`; `CallThrough` gives DDP a module whose forward
is the TTT pass.
"""

from __future__ import annotations

import gc
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from eaglewire.infra.ranks import local_rank, rank_world


class CallThrough(torch.nn.Module):
    """A module whose forward is `fn(module, ...)`: lets DDP wrap a pass that is not `module.forward`."""

    def __init__(self, module: torch.nn.Module, fn):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *args, **kwargs):
        return self.fn(self.module, *args, **kwargs)


def unwrap(net: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP and CallThrough wrappers (what is saved and evaluated)."""
    while isinstance(net, (DistributedDataParallel, CallThrough)):
        net = net.module
    return net


class Dist:
    """Rank, world size and this rank's device; the process group when torchrun started more than one."""

    def __init__(self, device: torch.device):
        self.rank, self.world = rank_world()
        if self.world > 1 and device.type == "cuda":
            # unlike the data stages (`ranks.local_device`) an explicit cuda:N is overridden too:
            # NCCL refuses two ranks on one GPU
            device = torch.device("cuda", local_rank())
            torch.cuda.set_device(device)
        self.device = device
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            # nccl reduces device tensors only; the callers' statistics live on the CPU
            moved = t.to(self.device)
            dist.all_reduce(moved)
            return moved.to(t.device)
        return t

    def gather(self, obj) -> list:
        """`obj` of every rank, in rank order (every rank calls this); [obj] outside torchrun."""
        if self.world == 1:
            return [obj]
        got: list = [None] * self.world
        dist.all_gather_object(got, obj)
        return got

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """DDP around `module` under torchrun (gradients averaged over ranks), `module` itself otherwise.

        Buffers (the draft vocab maps) are the same on every rank: synced once at init, not every forward.
        Drop every reference to the wrapper before `close`.
        """
        if self.world == 1:
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids, forward_sync_buffers=False)

    @staticmethod
    def no_sync(net: torch.nn.Module, sync: bool):
        """Skip DDP's all-reduce for a micro-batch that is not the last of its step (gradients accumulate locally)."""
        return nullcontext() if sync or not isinstance(net, DistributedDataParallel) else net.no_sync()

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            # a DDP reducer freed after its process group was destroyed hung the process at exit
            # (seen on gloo): collect any wrapper still in a reference cycle first
            gc.collect()
            dist.destroy_process_group()
