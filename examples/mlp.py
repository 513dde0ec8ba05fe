"""A fully seeded MLP on synthetic data: the reproducible baseline.

bisect-repro record examples/mlp.py:build --out runs/mlp --steps 50 --every 5
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(
    seed: int = 0, lr: float = 1e-3, batch_size: int = 32, num_workers: int = 0, hidden: int = 64
) -> Trainee:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(1024, 20, generator=data)
    targets = (inputs[:, :5].sum(dim=1) > 0).long()
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(
        nn.Linear(20, hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 2),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    return Trainee.supervised(
        model, optimizer, loader, nn.functional.cross_entropy, scheduler=scheduler
    )
