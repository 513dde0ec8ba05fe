"""DistributedDataParallel on two ranks (gloo on a CPU): an MLP with dropout, a seeded
DistributedSampler, Adam. Fully seeded: two recordings are identical, rank by rank.

    bisect-repro record examples/ddp.py:build --nproc-per-node 2 --steps 6 --every 2 --out runs/a
    bisect-repro record examples/ddp.py:build --nproc-per-node 2 --steps 6 --every 2 --out runs/b \\
        --set reseed_at=3
    bisect-repro compare runs/a runs/b --no-replay    # step 3, rank 1, torch reseeded from entropy

``reseed_at=k`` (with ``reseed_rank``, 1 by default): that rank calls ``torch.seed()`` before step
k, so its dropout masks differ from then on. ``drift_at=k`` (with ``drift_rank``): that rank adds
to its own copy of the first weight after step k, outside DDP, so the replicas part
(``bisect-repro show`` names the snapshot, the tensor and the rank).

As a script with its own loop, under your own torchrun:
``torchrun --nproc-per-node 2 examples/ddp.py --out runs/c``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee, current_step


def initialise() -> None:
    """The process group, unless the launcher (``bisect-repro record``) already made it."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def loader(seed: int, batch_size: int = 8) -> DataLoader:
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(64, 16, generator=data)
    targets = inputs[:, :4].sum(dim=1, keepdim=True)
    dataset = TensorDataset(inputs, targets)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=DistributedSampler(dataset, shuffle=True, seed=seed)
    )


def network(seed: int) -> nn.Module:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def planted(
    step: Callable[[object], torch.Tensor],
    weight: Callable[[], torch.Tensor],
    reseed_at: int | None,
    reseed_rank: int,
    drift_at: int | None,
    drift_rank: int,
) -> Callable[[object], torch.Tensor]:
    """``step`` with what the options plant: a reseeding from entropy, or a weight changed by one
    rank alone."""

    def planted_step(batch: object) -> torch.Tensor:
        now, rank = current_step(), dist.get_rank()
        if now == reseed_at and rank == reseed_rank:
            torch.seed()
        loss = step(batch)
        if now == drift_at and rank == drift_rank:
            with torch.no_grad():
                weight().add_(1e-3)  # this rank's copy only: DDP never sees it
        return loss

    return planted_step


def build(
    seed: int = 0,
    lr: float = 1e-2,
    reseed_at: int | None = None,
    reseed_rank: int = 1,
    drift_at: int | None = None,
    drift_rank: int = 1,
) -> Trainee:
    initialise()
    model = DistributedDataParallel(network(seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    trainee = Trainee.supervised(model, optimizer, loader(seed), nn.functional.mse_loss)
    assert trainee.step is not None
    trainee.step = planted(
        trainee.step, lambda: model.module[0].weight, reseed_at, reseed_rank, drift_at, drift_rank
    )
    return trainee


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--out", required=True, help="the run directory to record (one folder per rank)"
    )
    parser.add_argument("--steps", type=int, default=6, help="training steps, on every rank")
    parser.add_argument("--every", type=int, default=2, help="snapshot every this many steps")
    seeding = parser.add_argument_group("seeding", "how the ranks are seeded, and the planted bug")
    seeding.add_argument(
        "--seed", type=int, default=0, help="seeds the model and the DistributedSampler"
    )
    seeding.add_argument(
        "--reseed-at", type=int, default=None, help="rank 1 reseeds torch from entropy at this step"
    )
    args = parser.parse_args()
    initialise()
    model = DistributedDataParallel(network(args.seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    options = RecordOptions(steps=args.steps, every=args.every, force=True)
    with Recorder(
        args.out, Trainee(model, optimizer, loader(args.seed)), options, config=vars(args)
    ) as recorder:
        for inputs, targets in recorder.batches():
            if recorder.step == args.reseed_at and dist.get_rank() == 1:
                torch.seed()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            recorder.log(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
