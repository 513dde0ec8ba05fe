"""Tabular classifier with a train/validation split made by random_split.

The split has its own seeded generator so that the validation set is the same in every run.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def load_dataset(n=96, features=10, classes=3):
    g = torch.Generator().manual_seed(2024)
    centres = torch.randn(classes, features, generator=g) * 2
    labels = torch.arange(n) % classes
    return TensorDataset(centres[labels] + torch.randn(n, features, generator=g), labels)


def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct, loss = 0, 0, 0.0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            loss += loss_fn(logits, y).item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return loss / total, correct / total


def main():
    parser = argparse.ArgumentParser(description="tabular classifier")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=18)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--val-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-seed", type=int, default=42)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    dataset = load_dataset()
    train_set, val_set = random_split(
        dataset,
        [1 - args.val_fraction, args.val_fraction],
        generator=torch.Generator().manual_seed(args.split_seed),
    )
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)

    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
        val_loss, val_acc = evaluate(model, val_loader, loss_fn)
        print(
            f"epoch {epoch}: train loss {loss.item():.4f} val loss {val_loss:.4f} val acc "
            f"{val_acc:.2%}"
        )


if __name__ == "__main__":
    main()
