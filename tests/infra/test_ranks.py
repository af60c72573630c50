"""Rank and world come from torchrun's variables; a plain process is rank 0 of 1."""

import pytest
import torch

from eaglewire.infra import ranks


@pytest.fixture
def torchrun(monkeypatch):
    def set_env(rank, world, local):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", str(local))
    return set_env


def test_a_plain_process_is_rank_0_of_1(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert ranks.rank_world() == (0, 1) and ranks.local_rank() == 0
    assert ranks.is_main() and not ranks.distributed()


def test_torchrun_variables(torchrun):
    torchrun(5, 8, 1)
    assert ranks.rank_world() == (5, 8) and ranks.rank() == 5 and ranks.world_size() == 8
    assert ranks.local_rank() == 1 and ranks.distributed() and not ranks.is_main()


def test_local_device_gives_each_rank_its_gpu_only_for_a_bare_cuda(torchrun, monkeypatch):
    cuda, cuda0, cpu = torch.device("cuda"), torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert ranks.local_device(cuda) == cuda  # no torchrun: untouched
    torchrun(3, 4, 3)
    assert ranks.local_device(cuda) == torch.device("cuda", 3)
    assert ranks.local_device(cuda0) == cuda0 and ranks.local_device(cpu) == cpu  # explicit choices are kept
