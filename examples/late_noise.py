"""A recipe that seeds torch and NumPy but not Python's ``random``, and starts drawing from it
only after a warm-up: the runs match for ``warmup`` steps, then part ways in the forward pass of
the ``jitter`` layer. With ``--every 10`` the divergence lies strictly between two snapshots.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Jitter(nn.Module):
    """Scales activations by a random factor once the warm-up is over."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1.0 + 0.01 * random.random()) if self.active else x


def build(seed: int = 0, warmup: int = 37) -> Trainee:
    torch.manual_seed(seed)
    np.random.seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(512, 8, generator=data), torch.randn(512, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), Jitter(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # The warm-up is counted by the scheduler, whose state checkpoints restore.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        model[2].active = scheduler.last_epoch >= warmup
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    return Trainee(model, optimizer, loader, step, scheduler=scheduler)
