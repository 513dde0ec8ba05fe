"""A DataLoader loop with dropout and a per-step learning-rate schedule, knowing nothing of
bisect-repro. ``--reseed-at N`` plants a bug: torch is reseeded from entropy at step N (counted by
the scheduler, whose state the replay keeps), so that step's dropout differs in every run.
``--local-counter`` makes the loop scale the learning rate by its own ``enumerate`` counter, which
no checkpoint holds and a step run again from its kept start does not put back."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reseed-at", type=int, default=None)
    parser.add_argument("--local-counter", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(96, 6, generator=data), torch.randn(96, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=8,
        shuffle=True,
        generator=torch.Generator().manual_seed(2),
    )
    model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.5), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.97**step)
    for counter, (x, y) in enumerate(loader):
        if scheduler.last_epoch == args.reseed_at:
            torch.seed()
        if args.local_counter:
            for group in optimizer.param_groups:
                group["lr"] = 0.05 / (1 + counter)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
