from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from bisect_repro.capture.data import DataStream, describe_loader, loader_generators
from bisect_repro.capture.rng import RandomStreams


class Augmented(Dataset):
    """Draws from torch, NumPy and Python streams on every fetch, as augmentation does."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(
            [float(index), torch.rand(()).item(), float(np.random.rand()), random.random()]
        )


def seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def make_loader(num_workers: int, generator: torch.Generator | None = None) -> DataLoader:
    return DataLoader(
        Augmented(),
        batch_size=4,
        shuffle=True,
        num_workers=num_workers,
        worker_init_fn=seed_worker if num_workers else None,
        generator=generator,
    )


def stream_for(loader: DataLoader) -> DataStream:
    return DataStream(loader, RandomStreams(loader_generators(loader)))


@pytest.mark.parametrize("num_workers", [0, 2])
# 10 and 20: at the end of an epoch, before the loader says so
@pytest.mark.parametrize("stop", [3, 10, 17, 20])
# True: the sampler draws from the loader's generator, also as an epoch ends
@pytest.mark.parametrize("seeded", [False, True])
def test_resuming_mid_epoch_gives_the_batches_of_the_uninterrupted_run(
    num_workers: int, stop: int, seeded: bool
) -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    generator = (lambda: torch.Generator().manual_seed(5)) if seeded else (lambda: None)
    original = stream_for(make_loader(num_workers, generator()))
    for _ in range(stop):
        original.next_batch()
    saved_position, saved_streams = original.state_dict(), original.streams.state_dict()
    # crosses an epoch boundary (10 batches per epoch)
    expected = [original.next_batch() for _ in range(12)]
    original.close()

    torch.manual_seed(123)  # a different process state before the resume
    resumed = stream_for(make_loader(num_workers, generator()))
    resumed.load_state_dict(saved_position)
    resumed.streams.load_state_dict(saved_streams)
    got = [resumed.next_batch() for _ in range(12)]
    resumed.close()
    for (batch, indices), (want, want_indices) in zip(got, expected, strict=True):
        assert indices == want_indices
        assert torch.equal(batch, want)


def test_indices_are_the_samplers_and_the_sampler_is_given_back() -> None:
    dataset = TensorDataset(torch.arange(20.0))
    loader = DataLoader(
        dataset, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    original_sampler = loader.batch_sampler
    stream = stream_for(loader)
    batch, indices = stream.next_batch()
    assert batch[0].tolist() == [float(i) for i in indices]
    stream.close()
    assert loader.batch_sampler is original_sampler


def test_a_custom_batch_sampler_without_a_sampler_is_described() -> None:
    loader = DataLoader(TensorDataset(torch.arange(4.0)), batch_sampler=[[0, 1], [2, 3]])
    assert describe_loader(loader)["sampler"] == "list"
    stream = stream_for(loader)  # under the index tap as well
    assert describe_loader(loader)["sampler"] == "list"
    stream.close()


def test_plain_iterables_work_without_indices() -> None:
    stream = DataStream([torch.ones(1), torch.zeros(1)], RandomStreams())
    batches = [stream.next_batch() for _ in range(5)]
    assert [b[1] for b in batches] == [None] * 5
    assert stream.epoch == 2


def test_empty_loader_is_an_error() -> None:
    with pytest.raises(Exception, match="no batches"):
        DataStream([], RandomStreams()).next_batch()


def test_a_distributed_sampler_gets_each_epoch_and_its_state_is_recorded() -> None:
    dataset = TensorDataset(torch.arange(20.0))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=7)
    stream = stream_for(DataLoader(dataset, batch_size=5, sampler=sampler))
    seen = [stream.next_batch()[1] for _ in range(4)]  # two epochs of two batches
    expected = []
    for epoch in (0, 1):
        reference = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=7)
        reference.set_epoch(epoch)
        order = list(reference)
        expected += [order[:5], order[5:]]
    assert seen == expected and seen[:2] != seen[2:]  # set_epoch reshuffles each epoch
    state = stream.state_dict()["sampler"]
    assert state == {
        "type": "DistributedSampler",
        "seed": 7,
        "epoch": 1,
        "rank": 1,
        "num_replicas": 2,
        "shuffle": True,
        "drop_last": False,
    }
    # nothing for a sampler that does not split the data
    assert "sampler" not in stream_for(make_loader(0)).state_dict()
