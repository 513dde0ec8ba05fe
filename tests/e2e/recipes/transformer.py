"""A small Transformer language model with dropout, whose logging helper calls ``torch.seed()``
at one step (reseeding torch's stream from OS entropy): every run's dropout masks differ from then
on."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee, current_step


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, length: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(length, width))
        layer = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position))


def log_metrics(loss: torch.Tensor, reseed_at: int | None) -> None:
    """What a logging helper might do: (re)seed 'for the sampling of examples to show'."""
    if reseed_at is not None and current_step() == reseed_at:
        torch.seed()


def build(seed: int = 0, reseed_at: int | None = None, reseed_after: int | None = None) -> Trainee:
    """``reseed_at``: the helper reseeds before the step's forward pass; ``reseed_after``: after its
    update."""
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (256, 9), generator=data)
    loader = DataLoader(
        TensorDataset(tokens),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        (sequence,) = batch
        log_metrics(torch.zeros(()), reseed_at)
        optimizer.zero_grad(set_to_none=True)
        logits = model(sequence[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), sequence[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        log_metrics(loss, reseed_after)
        return loss

    return Trainee(model, optimizer, loader, step)
