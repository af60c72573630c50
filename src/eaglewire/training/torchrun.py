"""torchrun awareness for training: rank/world from the environment, DDP for the gradients.

Gradients are averaged by `torch.nn.parallel.DistributedDataParallel` (`--parallel ddp`)
(bucketed all-reduce overlapped with the backward) rather than a hand-written
all-reduce per parameter: same result (the equivalence test against one
process still holds), and the reduction of early buckets runs while later
layers are still differentiating. gloo on CPU, nccl on CUDA with each rank on
`cuda:LOCAL_RANK`.

DDP synchronises only gradients produced by a forward that went through it,
and TTT drives the drafter through its methods (`project`, `step_ttt`,
`logits`), not its `forward`; `CallThrough` gives DDP a module whose forward
is the TTT pass.

`--parallel fsdp` shards the drafter with FSDP2 (`fully_shard` on that same module, one group): each rank
holds 1/world of the weights (the frozen embedding, the largest, included), of the gradients and of the
AdamW state, and the forward all-gathers them. The gradient is reduce-scattered as the mean over ranks,
the same update DDP makes. Saved states are whole (gathered, written by rank 0, in the format a single
process writes), so a run resumes under either mode or none.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
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
    """The module inside DDP and CallThrough wrappers (what is saved and evaluated; under FSDP2 its weights
    are shards outside `Dist.whole`)."""
    while isinstance(net, (DistributedDataParallel, CallThrough)):
        net = net.module
    return net


class Dist:
    """Rank, world size and this rank's device; the process group when torchrun started more than one."""

    def __init__(self, device: torch.device, parallel: str = "ddp"):
        self.rank, self.world = rank_world()
        self.fsdp = parallel == "fsdp" and self.world > 1
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
        if self.fsdp:
            return fully_shard(module)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids, forward_sync_buffers=False)

    @staticmethod
    def no_sync(net: torch.nn.Module, sync: bool):
        """Skip the gradient reduction for a micro-batch that is not the last of its step (gradients accumulate locally)."""
        if isinstance(net, FSDPModule):
            return _fsdp_no_sync(net, sync)
        return nullcontext() if sync or not isinstance(net, DistributedDataParallel) else net.no_sync()

    @staticmethod
    def whole(net: torch.nn.Module):
        """A context in which an FSDP2 module holds its whole weights on every rank (every rank enters it):
        the drafter's own methods (validation) then read plain tensors. Nothing for DDP or one process."""
        return _unsharded(net) if isinstance(net, FSDPModule) else nullcontext()

    @staticmethod
    def full_states(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
        """The model's and optimizer's state dicts with every shard gathered (every rank calls this), in the
        format one process saves: what state/ holds whatever the mode."""
        return _full(model.state_dict()), {**opt.state_dict(), "state": {
            i: _full(st) for i, st in opt.state_dict()["state"].items()}}

    @staticmethod
    def load_optimizer(opt: torch.optim.Optimizer, saved: dict) -> None:
        """A whole saved optimizer state into `opt`, each tensor sharded as its parameter is under FSDP2."""
        params = [p for g in opt.param_groups for p in g["params"]]
        state = {}
        for i, st in saved.get("state", {}).items():
            p = params[i] if isinstance(i, int) and 0 <= i < len(params) else None
            state[i] = {k: distribute_tensor(v.to(p.to_local().device), p.device_mesh, p.placements)
                        if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape else v
                        for k, v in st.items()}
        opt.load_state_dict({**saved, "state": state})

    @staticmethod
    def scalar(x: torch.Tensor) -> torch.Tensor:
        """A plain tensor for a (possibly DTensor) reduced value such as FSDP2's gradient norm."""
        return x.full_tensor() if isinstance(x, DTensor) else x

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            # a DDP reducer freed after its process group was destroyed hung the process at exit
            # (seen on gloo): collect any wrapper still in a reference cycle first
            gc.collect()
            dist.destroy_process_group()


def _full(sd: dict) -> dict:
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}


@contextmanager
def _fsdp_no_sync(net, sync: bool):
    net.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        net.set_requires_gradient_sync(True)


@contextmanager
def _unsharded(net):
    net.unshard()
    try:
        yield
    finally:
        net.reshard()
