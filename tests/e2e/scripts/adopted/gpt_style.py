"""A training script in the style of small GPT trainers, knowing nothing of bisect-repro: batches
sampled by ``get_batch()`` from torch's global stream, the next batch prefetched while the model
computes, gradient accumulation, a module global ``iter_num``, and, with ``--reseed-at N``, a
reseed from entropy when ``iter_num`` reaches N (the planted bug)."""

import argparse

import torch
from torch import nn

from bisect_repro import Recorder, RecordOptions, Trainee

parser = argparse.ArgumentParser()
parser.add_argument("--reseed-at", type=int, default=None)
parser.add_argument("--max-iters", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(1337)
data = torch.randint(0, 64, (8192,), generator=torch.Generator().manual_seed(0))
block_size, batch_size, accumulation = 16, 8, 2


def get_batch():
    starts = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in starts])
    return x, y


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.head(self.drop(self.embed(idx)))
        return nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
iter_num = 0
recorder = Recorder("run", Trainee(model, optimizer, get_batch), RecordOptions(steps=args.max_iters, every=2, checkpoint_every=4, accumulate=accumulation))
for micro_batches in recorder.batches():
    if iter_num == args.reseed_at:
        torch.seed()
    for X, Y in micro_batches:
        loss = model(X, Y) / accumulation
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % 5 == 0:
        with torch.no_grad():
            print(f"iter {iter_num}: loss {loss.item() * accumulation:.4f}")
    iter_num += 1
