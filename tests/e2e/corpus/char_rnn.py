"""Character-level language model trained on a plain text file.

The dataset cuts the text into overlapping windows; an infinite random sampler (with
replacement) feeds a DataLoader with several worker processes, and training runs for a fixed
number of iterations rather than epochs.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler


class CharDataset(Dataset):
    def __init__(self, text, block_size):
        chars = sorted(set(text))
        print(f"data has {len(text)} characters, {len(chars)} unique.")
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.itos = {i: ch for i, ch in enumerate(chars)}
        self.vocab_size = len(chars)
        self.block_size = block_size
        self.data = text

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, idx):
        chunk = self.data[idx : idx + self.block_size + 1]
        dix = torch.tensor([self.stoi[s] for s in chunk], dtype=torch.long)
        return dix[:-1], dix[1:]


class CharRNN(nn.Module):
    def __init__(self, vocab_size, n_embd=16, n_hidden=32):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, n_embd)
        self.rnn = nn.GRU(n_embd, n_hidden, batch_first=True)
        self.head = nn.Linear(n_hidden, vocab_size)

    def forward(self, idx, targets=None):
        h, _ = self.rnn(self.embed(idx))
        logits = self.head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


@torch.no_grad()
def generate(model, dataset, prompt, steps):
    idx = torch.tensor([[dataset.stoi[c] for c in prompt]])
    for _ in range(steps):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return "".join(dataset.itos[int(i)] for i in idx[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", default="input.txt", help="text file to train on")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-iters", type=int, default=2000)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=3407)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    with open(args.input) as f:
        text = f.read()
    train_dataset = CharDataset(text, args.block_size)
    model = CharRNN(train_dataset.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1)

    train_loader = DataLoader(
        train_dataset,
        sampler=RandomSampler(
            train_dataset,
            replacement=True,
            num_samples=int(1e10),
            generator=torch.Generator().manual_seed(args.seed),
        ),
        shuffle=False,
        pin_memory=False,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
    )
    model.train()
    iter_num, t0 = 0, time.time()
    data_iter = iter(train_loader)
    while True:
        try:
            x, y = next(data_iter)
        except StopIteration:
            data_iter = iter(train_loader)
            x, y = next(data_iter)
        _, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if iter_num % 2 == 0:
            print(f"iter {iter_num}: train loss {loss.item():.5f} ({time.time() - t0:.2f}s)")
        iter_num += 1
        if iter_num >= args.max_iters:
            break
    model.eval()
    print(generate(model, train_dataset, "THE ", 20))


if __name__ == "__main__":
    main()
