"""A character-level model in the style of the small public ones: it reads ``data.txt`` from the
working directory, and draws fixed-length windows from an endless sampler with replacement, seeded,
through a DataLoader with two workers. A run from a checkout whose data file has one word changed
draws the same windows (the same sample order) with other characters in them."""

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

BLOCK = 8


class Windows(Dataset):
    def __init__(self, text: str, vocab: str) -> None:
        self.data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.data) - BLOCK - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i : i + BLOCK], self.data[i + 1 : i + BLOCK + 1]


class Endless(Sampler):
    def __init__(self, size: int) -> None:
        self.size = size
        self.generator = torch.Generator().manual_seed(3)

    def __iter__(self):
        while True:
            yield int(torch.randint(0, self.size, (1,), generator=self.generator))


def main() -> None:
    torch.manual_seed(0)
    text = Path("data.txt").read_text()
    vocab = "".join(sorted(set(text) | set("abcdefghijklmnopqrstuvwxyz .")))
    loader = DataLoader(
        Windows(text, vocab), batch_size=4, sampler=Endless(len(text) - BLOCK - 1), num_workers=2
    )
    model = nn.Sequential(
        nn.Embedding(len(vocab), 8), nn.Flatten(), nn.Linear(8 * BLOCK, len(vocab) * BLOCK)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, (x, y) in enumerate(loader):
        logits = model(x).view(-1, len(vocab))
        loss = nn.functional.cross_entropy(logits, y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 7:
            break


if __name__ == "__main__":
    main()
