"""A small conv net on synthetic images, on the GPU when there is one, as most training scripts
choose their device (``cuda`` if available). Fully seeded, and cuDNN restricted to deterministic
algorithms: two runs with the same settings match bit for bit.

- ``benchmark=true`` turns on ``torch.backends.cudnn.benchmark``: cuDNN times several algorithms
  for each new shape and keeps the fastest, which can round differently from the default pick,
  and differently from one run to the next.
- ``CUDA_VISIBLE_DEVICES=`` (empty) hides the GPU: the same seeded recipe then trains on the CPU,
  whose kernels round differently.
- ``autocast=true`` runs the forward pass in bf16 autocast; still deterministic.

    bisect-repro record examples/cuda_convnet.py:build --out runs/a --steps 12
    bisect-repro record examples/cuda_convnet.py:build --out runs/b --steps 12 --set benchmark=true
    bisect-repro compare runs/a runs/b
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee

__all__ = ["build"]


class GlobalMean(nn.Module):
    """The mean over the image: a plain reduction, where ``AdaptiveAvgPool2d``'s CUDA backward adds
    atomically."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def build(
    seed: int = 0,
    benchmark: bool = False,
    autocast: bool = False,
    channels: int = 32,
    batch_size: int = 64,
) -> Trainee:
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.Generator().manual_seed(3)
    images = torch.randn(1024, 3, 32, 32, generator=data)
    labels = torch.randint(0, 10, (1024,), generator=data)
    loader = DataLoader(
        TensorDataset(images, labels),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        GlobalMean(),
        nn.Linear(2 * channels, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        inputs, targets = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float(), targets)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
