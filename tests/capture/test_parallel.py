"""The parallel layout and DTensors as local shards, in this process on a one-rank gloo group."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from bisect_repro import Trainee
from bisect_repro.capture import parallel
from bisect_repro.capture.state import TrainingState, model_structure
from bisect_repro.errors import RecordingError
from bisect_repro.store import codec


@pytest.fixture
def group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield parallel.rank_info()
    dist.destroy_process_group()


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))


def sharded_trainee() -> Trainee:
    model = network()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    batches = [(torch.randn(4, 4), torch.randn(4, 1)) for _ in range(3)]
    return Trainee.supervised(model, optimizer, batches, nn.functional.mse_loss)


def test_this_process_is_a_rank_once_the_group_is_initialised(group) -> None:
    assert group == parallel.RankInfo(rank=0, world_size=1, local_rank=0, backend="gloo")


def test_a_rank_without_a_process_group_is_told_to_initialise_it(monkeypatch) -> None:
    assert parallel.rank_info() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert parallel.rank_info() is None  # one rank of one: a single process
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(
        RecordingError, match=r"rank 1 of 2 .* call torch.distributed.init_process_group\(\)"
    ):
        parallel.rank_info()


def test_layouts_and_what_the_replicas_share(group) -> None:
    assert (
        parallel.layout(network()) == "single"
        and parallel.describe(network(), group)["replicated"] == "none"
    )
    ddp = parallel.describe(DistributedDataParallel(network()), group)
    assert (
        ddp["layout"] == "ddp"
        and ddp["replicated"] == "all"
        and ddp["world_size"] == 1
        and ddp["backend"] == "gloo"
    )
    # a BatchNorm's own statistics
    assert ddp["rank_local"] == ["module.1.running_mean", "module.1.running_var"]
    unsynced = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else {}
    )
    alone = parallel.describe(
        DistributedDataParallel(network(), **(unsynced or {"broadcast_buffers": False})), group
    )
    assert alone["rank_local"] == [
        "module.1.running_mean",
        "module.1.running_var",
        "module.1.num_batches_tracked",
    ]
    sharded = parallel.describe(sharded_trainee().model, group)
    assert (
        sharded["layout"] == "fsdp"
        and sharded["replicated"] == "dtensor"
        and sharded["mesh"]["ranks"] == [0]
    )
    assert parallel.rank_identity(DistributedDataParallel(network()), group)["replica_group"] == [0]


def test_dtensors_are_hashed_and_checkpointed_as_local_shards_and_restored(group) -> None:
    trainee = sharded_trainee()
    state = TrainingState(trainee)
    assert trainee.step is not None
    trainee.step(next(iter(trainee.loader)))
    tensors = state.tensors()
    assert not any(parallel.is_dtensor(t) for t in tensors.values())
    placed = state.placements()
    assert placed["dtensors"]["0.weight"] == {"placements": ["S(0)"], "mesh": "0"}
    assert (
        "optimizer.0.weight.exp_avg" in placed["dtensors"]
        and "optimizer.0.weight.step" not in placed["dtensors"]
    )
    assert model_structure(trainee.model)["dtensors"]["2.bias"]["placements"] == ["S(0)"]
    data, raw = codec.encode(state.state_dict())
    saved = codec.decode(data, Path("checkpoint"), raw_size=raw)  # as a checkpoint reads back
    assert not any(parallel.is_dtensor(t) for t in saved["model"].values())
    before = {name: t.clone() for name, t in tensors.items()}
    trainee.step(next(iter(trainee.loader)))
    state.load_state_dict(saved)
    assert all(torch.equal(state.tensors()[name], before[name]) for name in before)
    assert all(parallel.is_dtensor(p) for p in trainee.model.parameters())
    trainee.step(next(iter(trainee.loader)))  # the restored shards train on
