"""A model initialised without a seed: every process starts from different weights.

The data is seeded; the model is not (torch's global generator starts from a random seed in each
process unless ``torch.manual_seed`` is called).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(seed: int | None = None) -> Trainee:
    if seed is not None:
        torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(256, 8, generator=data), torch.randn(256, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
