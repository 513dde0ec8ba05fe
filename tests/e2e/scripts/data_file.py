"""A classifier trained from a data file, knowing nothing of bisect-repro: a seeded DataLoader
over the rows of ``--data`` (one sample a line, six numbers and a label). Editing one row changes
the batch of the step that draws it, in that run only."""

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    rows = [line.split() for line in Path(args.data).read_text().splitlines() if line.strip()]
    inputs = torch.tensor([[float(v) for v in row[:6]] for row in rows])
    labels = torch.tensor([int(row[6]) for row in rows])
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=4, shuffle=False)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
