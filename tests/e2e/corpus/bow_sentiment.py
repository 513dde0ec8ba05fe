"""Bag-of-words sentiment classifier (EmbeddingBag) on generated reviews.

If --seed is not given a random one is picked and printed, so that a good run can be repeated.
"""

import argparse
import random

import torch
from torch import nn
from torch.utils.data import DataLoader

POSITIVE = ["good", "great", "fine", "lovely", "superb", "nice", "fun", "clever", "warm", "bright"]
NEGATIVE = ["bad", "awful", "dull", "boring", "poor", "weak", "slow", "grim", "cold", "flat"]
FILLER = ["the", "a", "film", "plot", "cast", "story", "was", "is", "and", "it", "very", "quite"]
VOCAB = {w: i for i, w in enumerate(POSITIVE + NEGATIVE + FILLER)}


def make_reviews(n, seed):
    rs = random.Random(seed)
    reviews = []
    for i in range(n):
        label = i % 2
        words = rs.choices(FILLER, k=6) + rs.choices(POSITIVE if label else NEGATIVE, k=2)
        rs.shuffle(words)
        reviews.append((label, " ".join(words)))
    return reviews


def collate_batch(batch):
    labels, tokens, offsets = [], [], [0]
    for label, text in batch:
        ids = torch.tensor([VOCAB[w] for w in text.split()], dtype=torch.long)
        labels.append(label)
        tokens.append(ids)
        offsets.append(ids.size(0))
    return torch.tensor(labels), torch.cat(tokens), torch.tensor(offsets[:-1]).cumsum(dim=0)


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim)
        self.fc = nn.Linear(embed_dim, num_class)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--embed-dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=random.randint(0, 2**31 - 1))
    args = parser.parse_args()
    print(f"seed: {args.seed}")
    torch.manual_seed(args.seed)

    train_iter = make_reviews(64, seed=0)
    dataloader = DataLoader(
        train_iter, batch_size=args.batch_size, shuffle=True, collate_fn=collate_batch
    )
    model = TextClassificationModel(len(VOCAB), args.embed_dim, 2)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)
    for epoch in range(1, args.epochs + 1):
        model.train()
        total_acc, total_count = 0, 0
        for label, text, offsets in dataloader:
            optimizer.zero_grad()
            predicted_label = model(text, offsets)
            loss = criterion(predicted_label, label)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            total_acc += (predicted_label.argmax(1) == label).sum().item()
            total_count += label.size(0)
        scheduler.step()
        print(f"| end of epoch {epoch:3d} | accuracy {total_acc / total_count:8.3f}")


if __name__ == "__main__":
    main()
