"""A plain training script, with no bisect-repro in it, whose loop counts its steps with
``enumerate`` and reseeds torch from entropy at ``--reseed-at`` (the planted bug); dropout draws
from torch's stream."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reseed-at", type=int, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(192, 8, generator=data), torch.randn(192, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for it, (x, y) in enumerate(loader):
        if it == args.reseed_at:
            torch.seed()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
