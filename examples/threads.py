"""A layer that centres its input on the mean of the whole batch: a reduction over a million
elements, which ATen's own CPU reduction splits across the intra-op threads. The split, and so the
rounding, depends on the thread count, on any CPU (this is ATen's code, not a vendor BLAS kernel).
Record it under ``OMP_NUM_THREADS=1`` and ``=2``:

    OMP_NUM_THREADS=1 bisect-repro record examples/threads.py:build --out runs/t1 --steps 10
    OMP_NUM_THREADS=2 bisect-repro record examples/threads.py:build --out runs/t2 --steps 10
    bisect-repro compare runs/t1 runs/t2
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Centre(nn.Module):
    """``x - x.mean()`` over every element of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean()


def build(seed: int = 0, features: int = 4096) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = (
        torch.randn(1024, features, generator=data),
        torch.randn(1024, 1, generator=data),
    )
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=256,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(Centre(), nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
