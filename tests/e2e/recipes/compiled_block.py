"""A tiny Transformer block (layer norm, attention by hand, GELU feed-forward), trained eager or,
with ``compile=true``, under ``torch.compile`` (Inductor on the CPU). Compiled, Inductor fuses the
layer norm and the GELU into its own C++ loops, whose rounding differs from eager's in the last
bits: the runs part at the first step. ``device="cuda", bf16=true`` trains on the GPU under bfloat16
autocast instead."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn(self.norm(x)).chunk(3, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        return x + self.mlp(self.norm(x))


def build(seed: int = 0, compile: bool = False, device: str = "cpu", bf16: bool = False) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 8, 16, generator=data), torch.randn(64, 8, 16, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = Block().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = torch.compile(model) if compile else model  # the Trainee names the module it wraps

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            outputs = model(batch[0].to(device))
        loss = nn.functional.mse_loss(outputs.float(), batch[1].to(device))
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
