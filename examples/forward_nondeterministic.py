"""A nondeterministic op in the forward pass: a batch of points is summed by cell with
``index_put_(..., accumulate=True)``. On two or more threads the CPU kernel adds the rows that
fall in one cell in an order that varies from call to call (a few thousand rows, 64 cells), so
two runs from the same state differ at rounding level in the ``pool`` layer's output. Everything
is seeded.

    bisect-repro doctor examples/forward_nondeterministic.py:build          # finds it
    bisect-repro doctor examples/forward_nondeterministic.py:build --set deterministic=true
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee

CELLS = 64


class CellSum(nn.Module):
    """Sums the batch's point features by cell: ``out[c] = sum(x[i] for cells[i] == c)``."""

    def forward(self, features: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        pooled = features.new_zeros(CELLS, features.shape[1])
        return pooled.index_put_((cells,), features, accumulate=True)


class PointsInCells(nn.Module):
    """Predicts a value per point from its own features and the sum over the points in its cell."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.encode = nn.Linear(3, width)
        self.pool = CellSum()
        self.head = nn.Linear(width, 1)

    def forward(self, points: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        features = self.encode(points)
        context = torch.index_select(self.pool(features, cells), 0, cells) / len(cells)
        return self.head(torch.tanh(features + context)).squeeze(-1)


def build(
    seed: int = 0,
    width: int = 32,
    batch_size: int = 4096,
    threads: int = 2,
    deterministic: bool = False,
) -> Trainee:
    data = torch.Generator().manual_seed(3)  # the dataset's own stream, apart from the global ones
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    points = torch.randn(16 * batch_size, 3, generator=data)
    cells = torch.randint(0, CELLS, (16 * batch_size,), generator=data)
    targets = points.sum(dim=1) + 0.1 * torch.randn(16 * batch_size, generator=data)
    dataset = TensorDataset(points, cells, targets)
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    model = PointsInCells(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        points, cells, targets = batch
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(points, cells), targets)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
