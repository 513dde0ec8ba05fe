"""Runs that can never match bit for bit: a small network whose first layer centres its input on
the mean of the whole batch, a reduction that ATen splits across the intra-op threads, so the
rounding depends on the thread count. Recorded with one thread and with two, the runs differ by
rounding only:

    export STEPS="--steps 12 --every 1"
    OMP_NUM_THREADS=1 bisect-repro record examples/rounding.py:build $STEPS --out runs/r1
    OMP_NUM_THREADS=2 bisect-repro record examples/rounding.py:build $STEPS --out runs/r2
    bisect-repro compare runs/r1 runs/r2

A departure that no recorded signal shows: with ``ROUNDING_EXAMPLE_BF16_FROM=N`` in the
environment (a variable the recorder does not fingerprint), layer ``3`` rounds its output through
bfloat16 from its N-th training step on, counted by a buffer so that a replay from a checkpoint
counts alike. The setting ``degrade_at=N`` does the same as a recorded config key: with another
thread count, compare finds the departure at step N, layer 3, caused by ``config (degrade_at)``:

    OMP_NUM_THREADS=2 bisect-repro record examples/rounding.py:build $STEPS --out runs/r3 \
        --set degrade_at=8
    bisect-repro compare runs/r1 runs/r3

``build_ddp``: the same kind of network (without the batch-wide centring, which a rank could only
take over its own share of the batch) under DistributedDataParallel, with a global batch of 64
whatever the world size; world size 1 and 2 differ by rounding only:

    export STEPS="--steps 8 --every 1"
    bisect-repro record examples/rounding.py:build_ddp --nproc-per-node 1 $STEPS --out runs/d1
    bisect-repro record examples/rounding.py:build_ddp --nproc-per-node 2 $STEPS --out runs/d2
    bisect-repro compare runs/d1 runs/d2

``build_fsdp``: the same network and data under FSDP2 (``fully_shard`` on each Linear and on the
root, over a one-dimensional mesh of every rank). Each rank records its own shards; compare adds
their sketches up by global index, and names DDP's ``module.0.weight`` as FSDP2's ``0.weight``. On
two ranks FSDP2 and DDP compute the same weights bit for bit (a sum of two gradients, halved, is
the same in either order); DDP on one rank against FSDP2 on two differ by rounding only:

    bisect-repro record examples/rounding.py:build_fsdp --nproc-per-node 2 $STEPS --out runs/f2
    bisect-repro compare runs/d2 runs/f2    # equal at every snapshot
    bisect-repro compare runs/d1 runs/f2    # rounding only
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bisect_repro import Trainee

PLANT = "ROUNDING_EXAMPLE_BF16_FROM"


class Centre(nn.Module):
    """``x - x.mean()`` over every element of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean()


class Planted(nn.Linear):
    """A linear layer whose output is rounded through bfloat16 from training step ``degrade_at``
    on (counted from 0), or else from the step ``PLANT`` names."""

    def __init__(self, features: int, out: int, degrade_at: int | None = None) -> None:
        super().__init__(features, out)
        self.degrade_at = degrade_at
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        variable = os.environ.get(PLANT)
        start = self.degrade_at if variable is None else int(variable)
        if self.training:
            self.calls += 1
        if start is not None and int(self.calls) > start:
            return y.to(torch.bfloat16).to(y.dtype)
        return y


def build(
    seed: int = 0,
    features: int = 1024,
    hidden: int = 32,
    samples: int = 512,
    degrade_at: int | None = None,
) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = (
        torch.randn(samples, features, generator=data),
        torch.randn(samples, 1, generator=data),
    )
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=64,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(
        Centre(),
        nn.Linear(features, hidden),
        nn.Tanh(),
        Planted(hidden, hidden, degrade_at),
        nn.Tanh(),
        nn.Linear(hidden, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)


def _replicated_parts(
    seed: int, features: int, hidden: int, samples: int, global_batch: int
) -> tuple[nn.Sequential, DataLoader]:
    """The network and each rank's loader of ``build_ddp`` and ``build_fsdp``."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = (
        torch.randn(samples, features, generator=data),
        torch.randn(samples, 1, generator=data),
    )
    dataset = TensorDataset(inputs, targets)
    # the same permutation on every world size, dealt out by rank
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=global_batch // dist.get_world_size(), sampler=sampler)
    network = nn.Sequential(
        nn.Linear(features, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 1),
    )
    return network, loader


def build_ddp(
    seed: int = 0, features: int = 256, hidden: int = 32, samples: int = 512, global_batch: int = 64
) -> Trainee:
    network, loader = _replicated_parts(seed, features, hidden, samples, global_batch)
    model = DistributedDataParallel(network)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)


def build_fsdp(
    seed: int = 0, features: int = 256, hidden: int = 32, samples: int = 512, global_batch: int = 64
) -> Trainee:
    network, loader = _replicated_parts(seed, features, hidden, samples, global_batch)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in network:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(network, mesh=mesh)
    optimizer = torch.optim.SGD(network.parameters(), lr=0.05)
    return Trainee.supervised(network, optimizer, loader, nn.functional.mse_loss)
