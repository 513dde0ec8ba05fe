"""Entry point: ``python -m imgclf.train --epochs 3``."""

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader

from .data import Textures
from .model import SmallConvNet


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="imgclf.train")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run_epoch(model, loader, optimizer, criterion, epoch):
    model.train()
    running, batches = 0.0, 0
    for images, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(images), targets)
        loss.backward()
        optimizer.step()
        running += loss.item()
        batches += 1
    print(f"[epoch {epoch}] loss {running / batches:.4f}")


def main(argv=None):
    args = parse_args(argv)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    loader = DataLoader(
        Textures(64), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    model = SmallConvNet(dropout=args.dropout)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        run_epoch(model, loader, optimizer, criterion, epoch)


if __name__ == "__main__":
    main()
