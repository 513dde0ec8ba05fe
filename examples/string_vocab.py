"""A vocabulary numbered in the iteration order of a ``set`` of strings: with string hashing
salted per process (``PYTHONHASHSEED`` unset), each process numbers the words differently, so the
same sentences become different token ids. Every random stream is seeded. The fix is
``sorted(set(...))``: ``--set sort_vocab=true``.

    bisect-repro doctor examples/string_vocab.py:build
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "log",
    "red",
    "blue",
    "big",
    "small",
    "quick",
    "slow",
]


def build(seed: int = 0, sort_vocab: bool = False) -> Trainee:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1)
    picks = torch.randint(0, len(WORDS), (256, 6), generator=data).tolist()
    sentences = [[WORDS[i] for i in row] for row in picks]
    vocabulary = {word for sentence in sentences for word in sentence}
    ordered = sorted(vocabulary) if sort_vocab else list(vocabulary)
    ids = {word: index for index, word in enumerate(ordered)}
    tokens = torch.tensor([[ids[word] for word in sentence] for sentence in sentences])
    targets = torch.randn(256, generator=data)
    loader = DataLoader(
        TensorDataset(tokens, targets),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = nn.Sequential(nn.EmbeddingBag(len(ids), 8), nn.Linear(8, 1), nn.Flatten(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)
