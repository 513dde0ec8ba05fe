"""A word-level LSTM language model in the shape of the word-language-model example: the corpus as
one tensor of token ids cut into columns, batches sliced from it (no DataLoader), the hidden state
carried from batch to batch and detached (truncated backpropagation through time), the weights
updated by hand (no optimizer), and the whole model pickled with ``torch.save`` whenever the
validation loss improves.
"""

import argparse
import math
import os

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="word-level language model")
parser.add_argument("--data", default="data/input.txt")
parser.add_argument("--emsize", type=int, default=16)
parser.add_argument("--nhid", type=int, default=16)
parser.add_argument("--lr", type=float, default=5.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--limit", type=int, default=3, help="batches per epoch")
parser.add_argument("--save", default="model.pt")
args = parser.parse_args()

torch.manual_seed(args.seed)


class Corpus:
    def __init__(self, path):
        self.word2idx = {}
        with open(path) as f:
            words = f.read().split()[:600]
        ids = [self.word2idx.setdefault(w, len(self.word2idx)) for w in words]
        split = len(ids) * 4 // 5
        self.train = torch.tensor(ids[:split], dtype=torch.long)
        self.valid = torch.tensor(ids[split:], dtype=torch.long)


corpus = Corpus(args.data)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, 2)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(1, bsz, self.nhid), weight.new_zeros(1, bsz, self.nhid))


ntokens = len(corpus.word2idx)
model = RNNModel(ntokens, args.emsize, args.nhid, args.dropout)
criterion = nn.NLLLoss()


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(2)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            output = torch.log_softmax(output.view(-1, ntokens), dim=1)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train():
    model.train()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        if batch == args.limit:
            break
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        output = torch.log_softmax(output.view(-1, ntokens), dim=1)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)


best_val_loss = None
for epoch in range(1, args.epochs + 1):
    train()
    val_loss = evaluate(val_data)
    print(f"epoch {epoch}: valid loss {val_loss:.2f}, ppl {math.exp(min(val_loss, 50)):.2f}")
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
os.remove(args.save)
