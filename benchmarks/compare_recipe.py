"""The recipe of the compare-cost benchmark: an MLP whose runs part ways at a chosen step.

Torch and NumPy are seeded, Python's ``random`` is not, and it is drawn from only from step
``diverge_at`` on (counted by the scheduler, whose state checkpoints restore): two runs match up
to that step and differ from it on, like a late-starting augmentation with an unseeded stream.
"""

from __future__ import annotations

import itertools
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Jitter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1.0 + 1e-3 * random.random()) if self.active else x


def build(width: int = 512, depth: int = 3, batch: int = 64, diverge_at: int = 1537) -> Trainee:
    torch.manual_seed(0)
    widths = [64] + [width] * depth
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, Jitter(), nn.Linear(width, 10))
    data = torch.Generator().manual_seed(1)
    inputs, targets = (
        torch.randn(batch * 64, 64, generator=data),
        torch.randint(0, 10, (batch * 64,), generator=data),
    )
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    jitter = model[-2]
    trainee = Trainee.supervised(
        model, optimizer, loader, nn.functional.cross_entropy, scheduler=scheduler
    )
    usual = trainee.step
    assert usual is not None

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        jitter.active = scheduler.last_epoch >= diverge_at
        return usual(batch)

    trainee.step = step
    return trainee
