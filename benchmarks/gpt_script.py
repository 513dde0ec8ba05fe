"""A GPT training script in the shape of small GPT trainers, knowing nothing of bisect-repro.

Batches are drawn with ``torch.randint`` from torch's global stream out of one long token array
(random tokens: no data set to download), moved to the GPU pinned and non-blocking; the model is
a pre-norm decoder with ``scaled_dot_product_attention`` and residual dropout, trained in bf16
autocast with AdamW and gradient clipping. ``--reseed-at N`` calls ``torch.seed()`` when the
iteration counter reaches N (a reseed from entropy: the planted late bug of the benchmarks).

    python benchmarks/gpt_script.py --iters 300                # 110M parameters on a GPU
    python benchmarks/gpt_script.py --iters 6 --size tiny      # a CPU check of the script itself
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {  # vocab, width, layers, heads, context, batch
    "gpt110m": (32000, 768, 12, 12, 512, 8),
    "tiny": (256, 64, 2, 2, 32, 4),
}

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=300)
parser.add_argument("--size", choices=sorted(SIZES), default="gpt110m")
parser.add_argument("--reseed-at", type=int, default=-1)
parser.add_argument("--lr", type=float, default=3e-4)
args = parser.parse_args()

vocab, width, layers, heads, context, batch_size = SIZES[args.size]
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(1337)
data = torch.randint(0, vocab, (200_000,), generator=torch.Generator().manual_seed(0))


def get_batch():
    starts = torch.randint(len(data) - context - 1, (batch_size,))
    x = torch.stack([data[i : i + context] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + context] for i in starts])
    if device == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
            device, non_blocking=True
        )
    return x, y


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
for iter_num in range(args.iters):
    if iter_num == args.reseed_at:
        torch.seed()
    X, Y = get_batch()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % 100 == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}")
