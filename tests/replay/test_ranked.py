"""The replica of a distributed run: its ranks under torchrun, replying for one, and ended as
one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bisect_repro.replay.launch import LaunchSpec, spec_for_recipe
from bisect_repro.replay.ranked import RankedReplica, start_replica
from bisect_repro.replay.replica import ReplicaFailed

RECIPE = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bisect_repro import Trainee


def build(fail_rank: int = -1) -> Trainee:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    data = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(4)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainee = Trainee.supervised(model, optimizer, data, nn.functional.mse_loss)
    step = trainee.step

    def failing(batch):
        if dist.get_rank() == fail_rank:
            raise RuntimeError(f"rank {fail_rank} broke")
        return step(batch)

    trainee.step = failing
    return trainee
"""


def test_a_distributed_spec_is_described_as_run_on_its_ranks() -> None:
    recipe = LaunchSpec(kind="recipe", target="train.py:build", config={"lr": 0.1}).on_ranks(4, 2)
    assert (
        recipe.describe() == "recipe train.py:build --set lr=0.1 --nproc-per-node 4 (focus: rank 2)"
    )
    script = LaunchSpec(kind="script", path="train.py", argv=["train.py", "--out", "r"]).on_ranks(
        2, 1
    )
    assert (
        script.describe()
        == "torchrun --standalone --nproc-per-node 2 train.py --out r (focus: rank 1)"
    )
    assert (
        LaunchSpec(kind="script", path="train.py", argv=["train.py"]).describe()
        == "python train.py"
    )


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its parent counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_replay_in_one_line_and_no_rank_is_left_waiting(tmp_path) -> None:
    (tmp_path / "recipe.py").write_text(RECIPE)
    spec = spec_for_recipe(f"{tmp_path / 'recipe.py'}:build", {"fail_rank": 1}).on_ranks(2, 0)
    started = time.monotonic()
    with start_replica(spec, "run A") as replica:
        assert isinstance(replica, RankedReplica)
        assert replica.connect().rank == 0 and sorted(replica.hellos) == [0, 1]
        pids = [hello.pid for hello in replica.hellos.values()]
        assert replica.fetch().step == 0
        with pytest.raises(ReplicaFailed) as failed:
            # rank 0 waits in DDP's all-reduce for rank 1, which raised
            replica.run(0, trace="none", commit=True)
        with pytest.raises(ReplicaFailed):  # and stays failed
            replica.hashes()
    message = str(failed.value)
    assert len(message.splitlines()) == 1 and message.startswith("replay of run A (recipe "), (
        message
    )
    assert "rank 1 stopped during 'run': RuntimeError: rank 1 broke" in message, message
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids) and replica.process.poll() is not None
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_rank_that_cannot_start_is_named(tmp_path) -> None:
    (tmp_path / "recipe.py").write_text(
        RECIPE.replace(
            "    torch.manual_seed(0)\n", "    assert dist.get_rank() != 1, 'no rank 1'\n"
        )
    )
    spec = spec_for_recipe(f"{tmp_path / 'recipe.py'}:build").on_ranks(2, 0)
    with start_replica(spec, "run B") as replica, pytest.raises(ReplicaFailed) as failed:
        replica.connect()
    message = str(failed.value)
    assert (
        len(message.splitlines()) == 1
        and "rank 1 exited" in message
        and "AssertionError: no rank 1" in message
    ), message
