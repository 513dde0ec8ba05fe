"""A character-level model of words in the shape of the small "make more" trainers: the words of a
text file become a dataset of padded id sequences, an ``InfiniteDataLoader`` wraps a DataLoader
whose sampler draws with replacement ``1e10`` times and hands out batches through ``.next()``,
and the loop is ``while True`` on a step counter with ``--max-steps`` (-1: forever). Every
``--eval-every`` steps a fresh shuffled DataLoader evaluates and a few words are sampled.

``--sampler-seed`` gives the training sampler a generator of its own; without it the sampler
seeds itself from torch's global stream when it is first iterated.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler


class CharDataset(Dataset):
    def __init__(self, words, chars, max_word_length):
        self.words = words
        self.chars = chars
        self.max_word_length = max_word_length
        self.stoi = {ch: i + 1 for i, ch in enumerate(chars)}  # 0 is the start/end token
        self.itos = {i: s for s, i in self.stoi.items()}

    def __len__(self):
        return len(self.words)

    def get_vocab_size(self):
        return len(self.chars) + 1

    def get_output_length(self):
        return self.max_word_length + 1

    def encode(self, word):
        return torch.tensor([self.stoi[w] for w in word], dtype=torch.long)

    def decode(self, ix):
        return "".join(self.itos[i] for i in ix)

    def __getitem__(self, idx):
        word = self.words[idx]
        ix = self.encode(word)
        x = torch.zeros(self.max_word_length + 1, dtype=torch.long)
        y = torch.zeros(self.max_word_length + 1, dtype=torch.long)
        x[1 : 1 + len(ix)] = ix
        y[: len(ix)] = ix
        y[len(ix) + 1 :] = -1  # no loss at the padding
        return x, y


def create_datasets(input_file):
    with open(input_file) as f:
        text = f.read().lower()
    words = sorted({w for w in "".join(c if c.isalpha() else " " for c in text).split()})
    chars = sorted(set("".join(words)))
    max_word_length = max(len(w) for w in words)
    test_set_size = min(20, len(words) // 10)
    rp = torch.randperm(len(words)).tolist()
    train_words = [words[i] for i in rp[:-test_set_size]]
    test_words = [words[i] for i in rp[-test_set_size:]]
    print(f"{len(words)} words, {len(chars)} characters, longest {max_word_length}")
    return (
        CharDataset(train_words, chars, max_word_length),
        CharDataset(test_words, chars, max_word_length),
    )


class InfiniteDataLoader:
    """A DataLoader that never runs out: its sampler draws with replacement, 1e10 times."""

    def __init__(self, dataset, generator=None, **kwargs):
        train_sampler = RandomSampler(
            dataset, replacement=True, num_samples=int(1e10), generator=generator
        )
        self.train_loader = DataLoader(dataset, sampler=train_sampler, **kwargs)
        self.data_iter = iter(self.train_loader)

    def next(self):
        try:
            batch = next(self.data_iter)
        except StopIteration:  # not expected, 1e10 samples
            self.data_iter = iter(self.train_loader)
            batch = next(self.data_iter)
        return batch


class MLP(nn.Module):
    """Predicts the next character from the embeddings of the previous block_size ones."""

    def __init__(self, vocab_size, block_size, n_embd=16, n_embd2=32):
        super().__init__()
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size + 1, n_embd)  # the extra token pads before the start
        self.mlp = nn.Sequential(
            nn.Linear(block_size * n_embd, n_embd2), nn.Tanh(), nn.Linear(n_embd2, vocab_size)
        )

    def forward(self, idx, targets=None):
        embs = []
        for _ in range(self.block_size):
            embs.append(self.wte(idx))
            idx = torch.roll(idx, 1, 1)
            idx[:, 0] = self.vocab_size
        logits = self.mlp(torch.cat(embs, -1))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
        return logits, loss


@torch.no_grad()
def evaluate(model, dataset, batch_size=16, max_batches=None):
    model.eval()
    loader = DataLoader(dataset, shuffle=True, batch_size=batch_size, num_workers=0)
    losses = []
    for i, (X, Y) in enumerate(loader):
        losses.append(model(X, Y)[1].item())
        if max_batches is not None and i >= max_batches:
            break
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def sample_words(model, dataset, num=4):
    idx = torch.zeros(num, 1, dtype=torch.long)
    for _ in range(dataset.get_output_length() - 1):
        logits, _ = model(idx[:, -model.block_size :])
        probs = F.softmax(logits[:, -1, :], dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
    words = []
    for row in idx[:, 1:].tolist():
        words.append(dataset.decode(row[: row.index(0)] if 0 in row else row))
    print("samples:", " ".join(words))


def main():
    parser = argparse.ArgumentParser(description="make more words")
    parser.add_argument("--input-file", "-i", type=str, default="data/input.txt")
    parser.add_argument("--num-workers", "-n", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=-1, help="-1: run forever")
    parser.add_argument("--seed", type=int, default=3407)
    parser.add_argument("--sampler-seed", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--batch-size", "-b", type=int, default=16)
    parser.add_argument("--learning-rate", "-l", type=float, default=5e-3)
    parser.add_argument("--weight-decay", "-w", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_dataset, test_dataset = create_datasets(args.input_file)
    model = MLP(train_dataset.get_vocab_size(), block_size=3)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=(0.9, 0.99),
        eps=1e-8,
    )
    generator = None
    if args.sampler_seed is not None:
        generator = torch.Generator().manual_seed(args.sampler_seed)
    batch_loader = InfiniteDataLoader(
        train_dataset, generator=generator, batch_size=args.batch_size, num_workers=args.num_workers
    )

    best_loss = None
    step = 0
    while True:
        t0 = time.time()
        X, Y = batch_loader.next()
        _, loss = model(X, Y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step} | loss {loss.item():.4f} | step time {(time.time() - t0) * 1000:.2f}ms")

        if step > 0 and step % args.eval_every == 0:
            test_loss = evaluate(model, test_dataset, max_batches=10)
            print(f"step {step} test loss {test_loss:.4f}")
            if best_loss is None or test_loss < best_loss:
                best_loss = test_loss
            sample_words(model, train_dataset)

        step += 1
        if args.max_steps >= 0 and step >= args.max_steps:
            break


if __name__ == "__main__":
    main()
