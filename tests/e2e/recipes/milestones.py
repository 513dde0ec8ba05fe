"""A recipe whose learning rate drops tenfold at a milestone step (``MultiStepLR``), set in its
config."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(milestone: int = 40, out_dir: str = "out") -> Trainee:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(512, 8, generator=data), torch.randn(512, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[milestone], gamma=0.1)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss, scheduler=scheduler)
