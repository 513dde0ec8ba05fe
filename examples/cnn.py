"""A small CNN on synthetic images, with random augmentation drawn in the loader's workers.

Fully seeded: the loader has a seeded generator (which fixes the order and the workers' base
seed) and a ``worker_init_fn`` that seeds NumPy and ``random`` in each worker.

    bisect-repro record examples/cnn.py:build --out runs/cnn --steps 50 --every 5
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

from bisect_repro import Trainee


class NoisyShapes(Dataset[tuple[torch.Tensor, int]]):
    """Synthetic 1x16x16 images of two classes, randomly flipped and noised on every fetch."""

    def __init__(self, size: int = 512) -> None:
        generator = torch.Generator().manual_seed(99)
        self.labels = torch.randint(0, 2, (size,), generator=generator)
        self.base = torch.randn(size, 1, 16, 16, generator=generator) * 0.1
        self.base[self.labels == 1, :, 4:12, 4:12] += 1.0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.base[index].clone()
        if torch.rand(()) < 0.5:  # drawn from the worker's torch stream
            image = image.flip(-1)
        image += 0.05 * torch.randn_like(image)
        image *= 1.0 + 0.1 * float(np.random.rand()) * (random.random() - 0.5)
        return image, int(self.labels[index])


def seed_worker(worker_id: int) -> None:
    info = get_worker_info()
    seed = (info.seed if info is not None else worker_id) % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build(
    seed: int = 0, lr: float = 1e-3, batch_size: int = 32, num_workers: int = 2, channels: int = 16
) -> Trainee:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loader = DataLoader(
        NoisyShapes(),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, channels * 2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(channels * 2, 2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * 10, momentum=0.9)
    return Trainee.supervised(model, optimizer, loader, nn.functional.cross_entropy)
