"""A shuffling DataLoader without a seeded generator.

The model is seeded inside ``torch.random.fork_rng`` (so the global stream is left as it was,
unseeded), and the DataLoader shuffles from that global stream: every process sees its own order.
The fix is ``DataLoader(..., generator=torch.Generator().manual_seed(seed))``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


def build(seed: int = 0, seeded_loader: bool = False) -> Trainee:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(256, 8, generator=data), torch.randn(256, 1, generator=data)
    generator = torch.Generator().manual_seed(seed) if seeded_loader else None
    loader = DataLoader(
        TensorDataset(inputs, targets), batch_size=32, shuffle=True, generator=generator
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
