"""A fully seeded MLP with dropout, compiled with ``torch.compile``."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(seed: int = 0) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(256, 16, generator=data), torch.randn(256, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(compiled(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
