"""The models the recording benchmarks train: an MLP, a GPT-style transformer, the CNN example and a
2M-parameter CNN on CIFAR-sized images."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from bisect_repro import Trainee

from .timing import Plan

__all__ = ["TinyGPT", "cnn2m_trainee", "cnn_trainee", "gpt_trainee", "mlp_trainee"]


def mlp_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    torch.manual_seed(seed)
    widths = plan.mlp_widths
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(widths[-1], 10)).to(device)
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(plan.batch * 32, widths[0], generator=data)
    targets = torch.randint(0, 10, (inputs.shape[0],), generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=plan.batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)


class TinyGPT(nn.Module):
    """GPT-style decoder: token and position embeddings, pre-norm causal blocks, tied output."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(
            width,
            heads,
            4 * width,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        h = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.norm(h) @ self.tokens.weight.t()


def gpt_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    torch.manual_seed(seed)
    g = plan.gpt
    model = TinyGPT(g["vocab"], g["width"], g["layers"], g["heads"], g["context"]).to(device)
    data = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, g["vocab"], (g["batch"] * 16, g["context"] + 1), generator=data)
    loader = DataLoader(
        TensorDataset(ids),
        batch_size=g["batch"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: tuple[torch.Tensor]) -> torch.Tensor:
        tokens = batch[0].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        # bf16 on a CPU may be emulated
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)


def cnn_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    """The CNN example as it is (``examples/cnn.py``), on the CPU."""
    from bisect_repro.record.recipe import build

    return build(
        f"{Path(__file__).resolve().parent.parent / 'examples' / 'cnn.py'}:build", {"seed": seed}
    )


class RandomImages(Dataset[tuple[torch.Tensor, int]]):
    """CIFAR-sized random images (3x32x32, ten classes), flipped at random in the loader's
    workers."""

    def __init__(self, size: int, side: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.images = torch.randn(size, 3, side, side, generator=generator)
        self.labels = torch.randint(0, 10, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if torch.rand(()) < 0.5:  # drawn from the worker's torch stream
            image = image.flip(-1)
        return image, int(self.labels[index])


def cnn2m_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    """A 2.1M-parameter CNN (four 3x3 convolutions with batch norm, two linear layers), SGD with
    momentum, on CIFAR-sized random images from a loader with two workers; the quick plan shrinks
    the widths and the images."""
    torch.manual_seed(seed)
    quick = plan.batch < 32
    c, side, hidden = (4, 16, 32) if quick else (16, 32, 3900)
    widths = [3, c, 2 * c, 4 * c, 8 * c]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [
            nn.Conv2d(a, b, 3, padding=1, bias=False),
            nn.BatchNorm2d(b),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
    flat = widths[-1] * (side // 16) ** 2
    model = nn.Sequential(
        *layers, nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    ).to(device)
    loader = DataLoader(
        RandomImages(plan.batch * 32, side),
        batch_size=plan.batch,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return Trainee.supervised(model, optimizer, loader, nn.functional.cross_entropy)
