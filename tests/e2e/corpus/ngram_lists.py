"""An n-gram language model in the shape of the word-embeddings tutorial: no DataLoader, the
inputs built one context at a time from Python lists, the vocabulary made from a set of words.

The ids a word gets come from the order the set iterates in, which depends on PYTHONHASHSEED.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--context", type=int, default=2)
parser.add_argument("--embedding-dim", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(1)

sonnet = """When forty winters shall besiege thy brow,
And dig deep trenches in thy beauty's field,
Thy youth's proud livery so gazed on now,
Will be a totter'd weed of small worth held:
Then being asked, where all thy beauty lies,
Where all the treasure of thy lusty days;"""
test_sentence = sonnet.split()

ngrams = [
    ([test_sentence[i - j - 1] for j in range(args.context)], test_sentence[i])
    for i in range(args.context, len(test_sentence))
]
vocab = set(test_sentence)
word_to_ix = {word: i for i, word in enumerate(vocab)}


class NGramLanguageModeler(nn.Module):
    def __init__(self, vocab_size, embedding_dim, context_size):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.linear1 = nn.Linear(context_size * embedding_dim, 32)
        self.linear2 = nn.Linear(32, vocab_size)

    def forward(self, inputs):
        embeds = self.embeddings(inputs).view((1, -1))
        out = F.relu(self.linear1(embeds))
        out = self.linear2(out)
        return F.log_softmax(out, dim=1)


losses = []
loss_function = nn.NLLLoss()
model = NGramLanguageModeler(len(vocab), args.embedding_dim, args.context)
optimizer = optim.SGD(model.parameters(), lr=0.001)

for _epoch in range(args.epochs):
    total_loss = 0
    for context, target in ngrams[:8]:
        context_idxs = torch.tensor([word_to_ix[w] for w in context], dtype=torch.long)
        model.zero_grad()
        log_probs = model(context_idxs)
        loss = loss_function(log_probs, torch.tensor([word_to_ix[target]], dtype=torch.long))
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    losses.append(total_loss)
print(losses)
