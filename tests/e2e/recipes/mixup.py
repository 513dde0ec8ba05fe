"""Mixup switched on after a warm-up counted on an object (which no checkpoint holds: counters in
module globals and closures are held, an object's attributes are not), its weight drawn from
NumPy's global stream, which the recipe never seeds."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Warmup:
    """Counts the steps taken."""

    calls = 0


def build(seed: int = 0, mixup_from: int = 12) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(512, 16, generator=data), torch.randn(512, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    warmup = Warmup()

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        warmup.calls += 1
        x, y = batch
        if warmup.calls > mixup_from:
            lam = float(np.random.beta(0.4, 0.4))
            x, y = lam * x + (1 - lam) * x.flip(0), lam * y + (1 - lam) * y.flip(0)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
