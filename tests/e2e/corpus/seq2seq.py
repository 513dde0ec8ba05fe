"""Sequence-to-sequence GRU that learns to reverse short digit strings.

Encoder and decoder are single-layer GRUs; at every decoding step the decoder is fed either the
true previous token (teacher forcing) or its own prediction, chosen at random. Source tokens are
dropped to <unk> at random in the dataset, as a light augmentation.
"""

import argparse
import random

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

PAD, SOS, UNK = 0, 1, 2
VOCAB = 13  # three specials and the digits 0-9


class ReversalPairs(Dataset):
    def __init__(self, n, length, token_dropout):
        g = torch.Generator().manual_seed(0)
        self.src = torch.randint(3, VOCAB, (n, length), generator=g)
        self.trg = self.src.flip(1)
        self.token_dropout = token_dropout

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        src = self.src[i].clone()
        for t in range(len(src)):
            if random.random() < self.token_dropout:
                src[t] = UNK
        return src, self.trg[i]


class Encoder(nn.Module):
    def __init__(self, emb_dim, hid_dim):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, emb_dim)
        self.rnn = nn.GRU(emb_dim, hid_dim, batch_first=True)

    def forward(self, src):
        _, hidden = self.rnn(self.embedding(src))
        return hidden


class Decoder(nn.Module):
    def __init__(self, emb_dim, hid_dim):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, emb_dim)
        self.rnn = nn.GRU(emb_dim, hid_dim, batch_first=True)
        self.fc_out = nn.Linear(hid_dim, VOCAB)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.embedding(input.unsqueeze(1)), hidden)
        return self.fc_out(output.squeeze(1)), hidden


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, src, trg, teacher_forcing_ratio=0.5):
        batch_size, trg_len = trg.shape
        outputs = torch.zeros(batch_size, trg_len, VOCAB)
        hidden = self.encoder(src)
        input = torch.full((batch_size,), SOS, dtype=torch.long)
        for t in range(trg_len):
            output, hidden = self.decoder(input, hidden)
            outputs[:, t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            input = trg[:, t] if teacher_force else output.argmax(1)
        return outputs


def train(model, iterator, optimizer, criterion, clip, tf_ratio):
    model.train()
    epoch_loss = 0
    for src, trg in iterator:
        optimizer.zero_grad()
        output = model(src, trg, tf_ratio)
        loss = criterion(output.reshape(-1, VOCAB), trg.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        epoch_loss += loss.item()
    return epoch_loss / len(iterator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--teacher-forcing", type=float, default=0.5)
    parser.add_argument("--token-dropout", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)

    train_data = ReversalPairs(48, args.length, args.token_dropout)
    train_iterator = DataLoader(
        train_data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    model = Seq2Seq(Encoder(8, 24), Decoder(8, 24))
    for param in model.parameters():
        nn.init.uniform_(param.data, -0.08, 0.08)
    optimizer = optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD)

    for epoch in range(args.epochs):
        train_loss = train(model, train_iterator, optimizer, criterion, 1.0, args.teacher_forcing)
        print(f"Epoch: {epoch + 1:02} | Train Loss: {train_loss:.3f}")


if __name__ == "__main__":
    main()
