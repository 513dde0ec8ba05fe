"""A stream's role comes from how its name was made: the global streams, a CUDA device's, a loader's
and its samplers' generators, the streams found inside a loader, and the recipe's own."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler

from bisect_repro.capture.data import loader_generators
from bisect_repro.capture.hidden import find_streams
from bisect_repro.capture.rng import GLOBAL_STREAMS, StreamRole, loader_draws_from, stream_role
from bisect_repro.integrations._common import loader_streams


class Noisy(Dataset):
    """A dataset that augments from a generator of its own."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index) + self.rng.random()])


class Shuffled(Sampler[int]):
    """A sampler that shuffles with a ``random.Random`` (no ``generator`` attribute)."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def __iter__(self):
        order = list(range(8))
        self.rng.shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return 8


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_names_the_loaders_streams_are_given_tell_their_roles() -> None:
    made = {
        **loader_generators(DataLoader(Noisy(), batch_size=2, shuffle=True, generator=seeded(0))),
        **loader_generators(
            DataLoader(Noisy(), sampler=RandomSampler(range(8), generator=seeded(1)))
        ),
        **loader_generators(
            DataLoader(
                Noisy(),
                batch_sampler=BatchSampler(RandomSampler(range(8), generator=seeded(2)), 2, False),
            )
        ),
        **find_streams(DataLoader(Noisy(), sampler=Shuffled())),
    }
    roles = {name: stream_role(name) for name in made}
    assert roles == {
        "loader.generator": StreamRole.LOADER,
        "sampler.generator": StreamRole.SAMPLER,
        "batch_sampler.generator": StreamRole.SAMPLER,
        "loader.dataset.rng": StreamRole.DATASET,
        "loader.sampler.rng": StreamRole.SAMPLER,
    }


def test_a_frameworks_loaders_streams_keep_their_roles_when_numbered() -> None:
    loaders = [
        DataLoader(Noisy(), generator=seeded(0)),
        DataLoader(Noisy(), generator=seeded(1)),
        DataLoader(Noisy(), shuffle=True),
    ]
    roles = {name: stream_role(name) for name in loader_streams(loaders)}
    assert roles == {
        "loader.dataset.rng": StreamRole.DATASET,
        "loader.generator": StreamRole.LOADER,
        "loader.dataset.rng#1": StreamRole.DATASET,
        "loader.generator#1": StreamRole.LOADER,
        "loader.dataset.rng#2": StreamRole.DATASET,
    }
    shuffled = loader_streams(
        [DataLoader(Noisy()), DataLoader(Noisy(), shuffle=True, generator=seeded(2))]
    )
    assert (
        stream_role("loader.sampler.generator#1") is StreamRole.SAMPLER
        and "loader.sampler.generator#1" in shuffled
    )


@pytest.mark.parametrize(
    ("name", "role"),
    [
        *((name, StreamRole.GLOBAL) for name in GLOBAL_STREAMS),
        ("cuda:0", StreamRole.CUDA),
        ("cuda:7", StreamRole.CUDA),
        # a generator's name, but the recipe's own: it does not shuffle the data
        ("noise_generator", StreamRole.RECIPE),
        ("my_sampler_rng", StreamRole.RECIPE),
        ("loader.samplers", StreamRole.RECIPE),  # not a path below loader.sampler
        ("loader.dataset.transforms[0].rng", StreamRole.DATASET),
        ("loader.batch_sampler.sampler.generator", StreamRole.SAMPLER),
    ],
)
def test_each_kind_of_name_has_one_role(name: str, role: StreamRole) -> None:
    assert stream_role(name) is role


def test_a_loader_draws_from_its_generators_its_samplers_and_torchs_global_stream() -> None:
    draws = [
        "torch",
        "loader.generator",
        "sampler.generator",
        "batch_sampler.generator",
        "loader.sampler.rng",
        "loader.generator#1",
    ]
    assert all(loader_draws_from(name) for name in draws)
    others = [
        "python",
        "numpy",
        "cuda:0",
        "loader.dataset.rng",
        "loader.dataset.generator",
        "noise_generator",
        "sampler_seed",
    ]
    assert not any(loader_draws_from(name) for name in others)
