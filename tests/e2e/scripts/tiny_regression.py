"""A regression loop with no DataLoader, knowing nothing of bisect-repro: batches drawn from a
seeded generator, dropout drawing from torch's global stream. ``--reseed-at N`` plants a bug:
torch is reseeded from entropy in iteration N, so that iteration's dropout differs in every run."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--reseed-at", type=int, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.5), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for iteration in range(args.iterations):
        x, y = torch.randn(8, 6, generator=data), torch.randn(8, 1, generator=data)
        if iteration == args.reseed_at:
            torch.seed()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
