"""A recipe whose dataset adds noise from a NumPy generator it holds (an augmentation), seeded, or
not seeded at all with ``seeded=False`` (the planted bug)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_repro import Trainee


class Noisy(Dataset):
    def __init__(self, seeded: bool) -> None:
        data = torch.Generator().manual_seed(0)
        self.inputs, self.targets = (
            torch.randn(256, 8, generator=data),
            torch.randn(256, 1, generator=data),
        )
        self.rng = np.random.default_rng(7 if seeded else None)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.from_numpy(self.rng.normal(0.0, 0.1, size=8).astype(np.float32))
        return self.inputs[index] + noise, self.targets[index]


def build(seeded: bool = True) -> Trainee:
    torch.manual_seed(0)
    loader = DataLoader(
        Noisy(seeded), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
