"""An epoch-based classifier in the style of the classic examples: argparse flags, Adadelta and a
StepLR that decays the learning rate by ``--gamma`` each epoch. Run with another ``--gamma``, the
runs part at the first step of the second epoch, where the decayed learning rates first differ."""

import argparse

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description="a small classifier")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--api-token", default=None, help="never used; a secret on the command line"
    )
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(64, 10, generator=data), torch.randint(0, 3, (64,), generator=data)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        scheduler.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
