"""A fully seeded recipe whose dataset adds per-sample noise from torch's stream in
``__getitem__``: in the main process with ``num_workers=0``, in the workers otherwise."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_repro import Trainee


class Noisy(Dataset):
    def __init__(self) -> None:
        data = torch.Generator().manual_seed(0)
        self.inputs, self.targets = (
            torch.randn(256, 8, generator=data),
            torch.randn(256, 1, generator=data),
        )

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index] + 0.01 * torch.randn(8), self.targets[index]


def build(seed: int = 0, num_workers: int = 0) -> Trainee:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loader = DataLoader(
        Noisy(),
        batch_size=32,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
