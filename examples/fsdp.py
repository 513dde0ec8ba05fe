"""FSDP2 (``fully_shard``) on two ranks, on a CPU with gloo: the model of ``ddp.py``, each Linear
and the root sharded over a one-dimensional mesh of every rank, Adam on the shards.

    bisect-repro record examples/fsdp.py:build --nproc-per-node 2 --steps 6 --every 2 --out runs/a
    bisect-repro record examples/fsdp.py:build --nproc-per-node 2 --steps 6 --every 2 \\
        --out runs/b --set reseed_at=3
    bisect-repro compare runs/a runs/b --no-replay    # step 3, rank 1, torch reseeded from entropy

Each rank records the hashes of its own shards and their placements (``S(0)``: dimension 0 split
over the mesh); the parameters are not replicated, so ``show`` compares only what is (Adam's
``step``). The options are ``ddp.py``'s: ``reseed_at``/``reseed_rank``, ``drift_at``/``drift_rank``
(here a change to that rank's shard).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from ddp import initialise, loader, network, planted
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bisect_repro import Trainee


def build(
    seed: int = 0,
    lr: float = 1e-2,
    reseed_at: int | None = None,
    reseed_rank: int = 1,
    drift_at: int | None = None,
    drift_rank: int = 1,
) -> Trainee:
    initialise()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = network(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    trainee = Trainee.supervised(model, optimizer, loader(seed), nn.functional.mse_loss)
    assert trainee.step is not None
    trainee.step = planted(
        trainee.step,
        lambda: model[0].weight.to_local(),
        reseed_at,
        reseed_rank,
        drift_at,
        drift_rank,
    )
    return trainee
