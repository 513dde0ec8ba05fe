"""A character-level language model fed from an ``IterableDataset`` in the shape of streaming
loaders: the dataset reads the text and yields fixed windows in order, and each DataLoader worker
keeps every ``num_workers``-th window of the stream (its shard, from ``get_worker_info()``). The
loader collects each batch from one worker, the workers taking turns.
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class TextWindows(IterableDataset):
    def __init__(self, path, block_size):
        super().__init__()
        with open(path) as f:
            self.text = f.read()
        self.chars = sorted(set(self.text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.block_size = block_size

    def stream(self):
        ids = [self.stoi[c] for c in self.text]
        for start in range(0, len(ids) - self.block_size - 1, self.block_size):
            chunk = torch.tensor(ids[start : start + self.block_size + 1])
            yield chunk[:-1], chunk[1:]

    def __iter__(self):
        info = get_worker_info()
        if info is None:  # loading in the main process: the whole stream
            return self.stream()
        return itertools.islice(self.stream(), info.id, None, info.num_workers)


class ConvLM(nn.Module):
    def __init__(self, vocab_size, n_embd=16, kernel=4):
        super().__init__()
        self.kernel = kernel
        self.embed = nn.Embedding(vocab_size, n_embd)
        self.conv = nn.Conv1d(n_embd, 32, kernel)
        self.head = nn.Linear(32, vocab_size)

    def forward(self, idx):
        x = self.embed(idx).transpose(1, 2)
        x = F.relu(self.conv(F.pad(x, (self.kernel - 1, 0))))  # causal: pad on the left
        return self.head(x.transpose(1, 2))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/input.txt")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    dataset = TextWindows(args.data, args.block_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    model = ConvLM(len(dataset.chars))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0
    while step < args.max_steps:
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step >= args.max_steps:
                break


if __name__ == "__main__":
    main()
