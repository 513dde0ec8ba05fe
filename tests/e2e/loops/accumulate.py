"""A loop in the style of small GPT training scripts: batches sampled by ``get_batch()`` from
torch's global stream (no DataLoader: the function itself is the data source), gradient accumulation
over micro-batches, a module global ``iter_num``, and a reseed from entropy when ``iter_num``
reaches ``--reseed-at`` (the planted bug)."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bisect_repro import Recorder, RecordOptions, Trainee

iter_num = 0
data = torch.randint(0, 64, (4096,), generator=torch.Generator().manual_seed(0))


def get_batch(block: int = 16, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(data) - block - 1, (batch_size,))
    x = torch.stack([data[i : i + block] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + block] for i in starts])
    return x, y


def main() -> None:
    global iter_num
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reseed-at", type=int, default=None)
    args = parser.parse_args()
    torch.manual_seed(1337)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Dropout(0.1), nn.Linear(32, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = RecordOptions(steps=10, every=2, checkpoint_every=4, accumulate=2, force=True)
    recorder = Recorder(args.out, Trainee(model, optimizer, get_batch), options, config=vars(args))
    for micro_batches in recorder.batches():
        if iter_num == args.reseed_at:
            torch.seed()
        for x, y in micro_batches:
            loss = nn.functional.cross_entropy(model(x).view(-1, 64), y.view(-1)) / len(
                micro_batches
            )
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recorder.log(loss)
        iter_num += 1
    recorder.close()


if __name__ == "__main__":
    main()
