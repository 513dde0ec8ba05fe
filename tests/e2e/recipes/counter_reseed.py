"""A loop that keeps its own step counter in a closure and reseeds torch from entropy when it
reaches a value: before the step's forward pass, or (``after_update``) once the step's update is
taken, as a logging helper would, so that the next snapshot's tensors are still equal and only the
stream differs."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(seed: int = 0, reseed_at: int | None = None, after_update: bool = False) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(512, 8, generator=data), torch.randn(512, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    count = {"n": 0}

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        count["n"] += 1
        reseed = reseed_at is not None and count["n"] == reseed_at + 1
        if reseed and not after_update:
            torch.seed()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        if reseed and after_update:
            torch.seed()
        return loss

    return Trainee(model, optimizer, loader, step)
