"""A dataset that augments from a NumPy Generator of its own, created without a seed.

Everything else is seeded (torch, NumPy's and Python's global streams, the loader's shuffle), so
the usual checklist passes; yet ``np.random.default_rng()`` draws its seed from the OS, and each
process adds different noise to the same samples. The fix is a seed for the dataset's generator:
``--set seed_augment=true``.

    bisect-repro doctor examples/augment_rng.py:build
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_repro import Trainee


class NoisyPoints(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed points and targets; each fetch adds Gaussian noise drawn from ``self.rng``."""

    def __init__(self, rng: np.random.Generator, size: int = 256) -> None:
        data = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(size, 8, generator=data)
        self.targets = self.inputs.sum(dim=1, keepdim=True)
        self.rng = rng

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.from_numpy(self.rng.normal(0.0, 0.05, size=8).astype(np.float32))
        return self.inputs[index] + noise, self.targets[index]


def build(seed: int = 0, seed_augment: bool = False) -> Trainee:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed) if seed_augment else np.random.default_rng()
    loader = DataLoader(
        NoisyPoints(rng), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
