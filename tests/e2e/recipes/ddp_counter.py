"""A two-rank DDP recipe whose step counts its own calls in a closure and, on one rank, reseeds
torch from entropy when the count reaches ``reseed_at`` (the planted bug)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bisect_repro import Trainee


def build(seed: int = 0, reseed_at: int | None = None, reseed_rank: int = 1) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(64, 16, generator=data)
    dataset = TensorDataset(inputs, inputs[:, :4].sum(dim=1, keepdim=True))
    loader = DataLoader(
        dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=True, seed=seed)
    )
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    calls = {"n": 0}

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        if calls["n"] == reseed_at and dist.get_rank() == reseed_rank:
            torch.seed()
        calls["n"] += 1
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
