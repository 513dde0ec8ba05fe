"""An MLP with dropout on the GPU (the CPU without one), whose matmuls are large enough for TF32 to
change their rounding. Fully seeded, and deterministic on one GPU.

- ``tf32=true`` sets ``torch.backends.cuda.matmul.allow_tf32``; the same happens to a run
  started with ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` in its environment, and
  ``NVIDIA_TF32_OVERRIDE=0`` turns TF32 off again below PyTorch.
- ``reseed_at=N``: the logging helper calls ``torch.cuda.seed()`` at step N, reseeding the GPU's
  generator from OS entropy, so the dropout masks of every run differ from then on.
- ``autocast=true`` runs the forward pass in bf16 autocast; still deterministic.

    bisect-repro record examples/cuda_mlp.py:build --out runs/a --steps 12
    export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
    bisect-repro record examples/cuda_mlp.py:build --out runs/b --steps 12
    bisect-repro compare runs/a runs/b
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee, current_step

__all__ = ["build"]


def log_metrics(loss: torch.Tensor, reseed_at: int) -> None:
    """What a logging helper might do: reseed the GPU 'to sample some predictions to show'."""
    if current_step() == reseed_at:
        torch.cuda.seed()


def build(
    seed: int = 0,
    tf32: bool = False,
    reseed_at: int = -1,
    autocast: bool = False,
    width: int = 1024,
) -> Trainee:
    if tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.Generator().manual_seed(5)
    inputs = torch.randn(4096, 256, generator=data)
    targets = torch.randint(0, 10, (4096,), generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=256,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(
        nn.Linear(256, width),
        nn.GELU(),
        nn.Dropout(0.1),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Dropout(0.1),
        nn.Linear(width, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        inputs, targets = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float(), targets)
        loss.backward()
        optimizer.step()
        log_metrics(loss, reseed_at)
        return loss

    return Trainee(model, optimizer, loader, step)
