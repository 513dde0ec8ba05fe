"""A recipe whose step counts its calls in an object's attribute (which no checkpoint holds) and
reseeds torch from entropy when the count reaches ``reseed_at`` (the planted bug)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Steps:
    def __init__(self) -> None:
        self.done = 0


def build(seed: int = 0, reseed_at: int | None = None) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(192, 8, generator=data), torch.randn(192, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = Steps()

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        if steps.done == reseed_at:
            torch.seed()
        steps.done += 1
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
