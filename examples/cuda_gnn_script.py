"""A plain training script, knowing nothing of bisect-repro, in the style of graph-network
examples: each layer gathers messages along the edges and sums them into the target nodes with
``scatter_add_``, which on a GPU adds atomically, so the sums round differently from run to run.
Seeded. Runs on the CPU without a GPU.

    bisect-repro record --out runs/a -- python examples/cuda_gnn_script.py
    bisect-repro record --out runs/b -- python examples/cuda_gnn_script.py
    bisect-repro compare runs/a runs/b
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--deterministic", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
torch.use_deterministic_algorithms(args.deterministic)
device = "cuda" if torch.cuda.is_available() else "cpu"

nodes, edges, features = 4096, 65536, 32
graph = torch.Generator().manual_seed(1)
source = torch.randint(0, nodes, (edges,), generator=graph).to(device)
# a few hub nodes take most messages
target = torch.randint(0, 64, (edges,), generator=graph).to(device)
x = torch.randn(nodes, features, generator=graph).to(device)
y = torch.randn(nodes, 1, generator=graph).to(device)


class GraphConv(nn.Module):
    def __init__(self, width_in, width_out):
        super().__init__()
        self.message = nn.Linear(width_in, width_out)
        self.update = nn.Linear(width_in + width_out, width_out)

    def forward(self, h):
        messages = self.message(h)[source]
        summed = torch.zeros(h.shape[0], messages.shape[1], device=h.device)
        summed.scatter_add_(0, target.unsqueeze(1).expand_as(messages), messages)
        return torch.relu(self.update(torch.cat([h, summed], dim=1)))


model = nn.Sequential(GraphConv(features, 64), GraphConv(64, 64), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(args.epochs):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if epoch % 4 == 0:
        print(f"epoch {epoch}: loss {loss.item():.5f}")
