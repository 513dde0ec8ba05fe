"""An image classifier in the shape of the big image-classification trainers: a config-file parser
read first with ``parse_known_args``, then the main parser on what is left; a loader wrapper that
takes batch N+1 from the DataLoader while step N trains; random flips and crops drawn in the
loader's workers from torch's stream.

The loader's generator is seeded, so each worker starts from the same seed in every run; which
worker loads which batch depends on the number of workers.
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

config_parser = argparse.ArgumentParser(add_help=False)
config_parser.add_argument("-c", "--config", default="", help="a JSON file of defaults")
parser = argparse.ArgumentParser(description="image classification")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("-j", "--workers", type=int, default=1)
parser.add_argument("--seed", type=int, default=42)


def parse():
    known, remaining = config_parser.parse_known_args()
    if known.config:
        with open(known.config) as f:
            parser.set_defaults(**json.load(f))
    return parser.parse_args(remaining)


class RandomImages(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(size, 3, 12, 12, generator=g)
        self.labels = torch.randint(0, 4, (size,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        top, left = torch.randint(0, 3, (2,)).tolist()
        return image[:, top : top + 10, left : left + 10], int(self.labels[index])


class PrefetchLoader:
    """Yields batch N while batch N+1 is already taken from the loader, normalised on the way."""

    def __init__(self, loader, mean=0.5, std=0.25):
        self.loader, self.mean, self.std = loader, mean, std

    def __iter__(self):
        ready = None
        for next_input, next_target in self.loader:
            next_input = (next_input - self.mean) / self.std
            if ready is not None:
                yield ready
            ready = next_input, next_target
        if ready is not None:
            yield ready

    def __len__(self):
        return len(self.loader)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def train_one_epoch(model, loader, optimizer):
    model.train()
    for images, targets in loader:
        loss = F.cross_entropy(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    args = parse()
    torch.manual_seed(args.seed)
    loader = DataLoader(
        RandomImages(48),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
        persistent_workers=args.workers > 0,
    )
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for _ in range(args.epochs):
        train_one_epoch(model, PrefetchLoader(loader), optimizer)


if __name__ == "__main__":
    main()
