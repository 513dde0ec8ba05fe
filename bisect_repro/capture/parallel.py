"""Distributed training as the recorder sees it: which rank this process is, how the model is laid
out over the ranks, and DTensors as the local shards this rank holds.

- :func:`rank_info` says whether this process is one rank of several: ``None`` for a single
  process, a :class:`RankInfo` when ``torch.distributed`` is initialised. A process that
  ``RANK`` and ``WORLD_SIZE`` say is one of several, without an initialised process group, is
  refused with the fix (initialise it first): the ranks agree on the run directory through it.
- :func:`layout` names the parallel layout of a model: ``ddp`` (``DistributedDataParallel``),
  ``fsdp`` (FSDP2's ``fully_shard``, or FSDP1), ``dtensor`` (DTensor parameters without FSDP,
  such as tensor parallelism), or ``single`` (no wrapper: each rank trains its own model).
- :func:`local` is a DTensor's local shard (``to_local()``), what this rank holds and hashes;
  :func:`localize` does it over a whole state dict (a checkpoint holds local shards only), and
  :func:`distribute_like` / :func:`distribute_optimizer_state` turn them back into DTensors laid
  out as the model's own, for a resume.
- :func:`describe` is the ``distributed`` object of ``run.json`` (world size, backend, layout,
  mesh, which tensors are replicated); :func:`placements` the placements and meshes of DTensors,
  which the model structure records for parameters and buffers and each snapshot for every
  tensor it hashes as a local shard (optimizer state appears only once the optimizer steps);
  :func:`rank_identity` what ``rank{r}/rank.json`` holds: the global rank, and where it ran (its
  host, and under torchrun its node, ``GROUP_RANK``, and the nodes' shape). The run's ``launcher``
  carries a random ``run_id``, which every rank copies into its ``rank.json`` when it joins, so a
  rank folder of another run is told apart.

Which tensors data-parallel replicas must hold equal, as recorded (``replicated``): ``all`` under
DDP (parameters, optimizer state, and buffers but the rank-local ones); ``dtensor`` when
parameters are DTensors (a DTensor is replicated along the mesh dimensions where its placement is
``Replicate``, its optimizer state like it; plain tensors over the whole world); ``none``
otherwise. Rank-local buffers are the running statistics of batch norms (not ``SyncBatchNorm``),
which each rank updates from its own batches, and every buffer of a DDP model that does not
synchronise them at each forward (``forward_sync_buffers=False``, formerly ``broadcast_buffers``).

Where the guarantees stop: nothing here communicates; a layout is read from the model's types
(a DDP wrapper passed to the Trainee, ``FSDPModule``, DTensor parameters), so a model trained
under a wrapper the Trainee does not hold, or gradients averaged by hand, reads as ``single``.
"""

from __future__ import annotations

import os
import platform
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

if TYPE_CHECKING:
    # for annotations only: never imported here (see _dtensor_class)
    from torch.distributed.tensor import DTensor

from ..errors import RecordingError

__all__ = [
    "RankInfo",
    "describe",
    "distribute_like",
    "distribute_optimizer_state",
    "is_dtensor",
    "layout",
    "local",
    "localize",
    "locals_and_placements",
    "model_placements",
    "placements",
    "rank_identity",
    "rank_info",
]


@dataclass(frozen=True)
class RankInfo:
    """This process's place among the ranks of a distributed run."""

    rank: int
    world_size: int
    local_rank: int
    backend: str | None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else None


def rank_info() -> RankInfo | None:
    """``None`` for a single process; this rank otherwise (see the module docstring)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = _env_int("LOCAL_RANK")
        return RankInfo(
            rank, world, rank if local_rank is None else local_rank, str(dist.get_backend())
        )
    world_size = _env_int("WORLD_SIZE")
    if world_size is not None and world_size > 1:
        raise RecordingError(
            f"Recorder: this process is rank {os.environ.get('RANK', '?')} of {world_size} (RANK "
            "and WORLD_SIZE are set) but "
            "torch.distributed is not initialised; call torch.distributed.init_process_group() "
            "before creating the Recorder"
        )
    return None


def _dtensor_class() -> type[DTensor] | None:
    """``DTensor`` once something imported it (a model that holds DTensors did); never imported
    here."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(value, dtensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a tensor: a DTensor's local shard, any other tensor as it is."""
    # torch types detach() as Tensor
    return cast("DTensor", tensor.detach()).to_local() if is_dtensor(tensor) else tensor


def locals_and_placements(
    tensors: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """:func:`local` of each tensor, and their :func:`placements`: the tensors as they are, and no
    placements, without a check per tensor where nothing has imported ``DTensor`` (a snapshot of
    every step walks hundreds of tensors)."""
    if _dtensor_class() is None:
        return dict(tensors), {}
    return {name: local(tensor) for name, tensor in tensors.items()}, placements(tensors)


def localize(tree: Any) -> Any:
    """A state tree with every DTensor replaced by its local shard (for a checkpoint)."""
    if isinstance(tree, torch.Tensor):
        return local(tree)
    if isinstance(tree, dict):
        return {key: localize(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [localize(value) for value in tree]
    if isinstance(tree, tuple):
        return tuple(localize(value) for value in tree)
    return tree


def _like(shard: torch.Tensor, reference: Any) -> torch.Tensor:
    """``shard`` as a DTensor laid out as ``reference`` (a DTensor of the same global shape)."""
    dtensor = _dtensor_class()
    assert dtensor is not None
    shard = shard.to(device=reference.to_local().device, dtype=reference.dtype)
    return dtensor.from_local(
        shard,
        reference.device_mesh,
        reference.placements,
        run_check=False,
        shape=reference.shape,
        stride=reference.stride(),
    )


def distribute_like(state: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict of local shards made DTensors wherever ``reference`` (the model's own) holds
    one."""
    found = dict(state)
    for name, value in found.items():
        if (
            isinstance(value, torch.Tensor)
            and not is_dtensor(value)
            and is_dtensor(reference.get(name))
        ):
            found[name] = _like(value, reference[name])
    return found


def distribute_optimizer_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """An optimizer state dict of local shards made DTensors for DTensor parameters (non-scalar
    state only)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ids = [i for group in state.get("param_groups", []) for i in group.get("params", [])]
    by_id = dict(zip(ids, params, strict=False))
    per_param = {}
    for key, values in (state.get("state") or {}).items():
        param = by_id.get(key)
        if param is None or not is_dtensor(param) or not isinstance(values, dict):
            per_param[key] = values
            continue
        per_param[key] = {
            k: _like(v, param)
            if isinstance(v, torch.Tensor) and not is_dtensor(v) and v.dim() > 0
            else v
            for k, v in values.items()
        }
    return {**state, "state": per_param}


def _wrapped(model: torch.nn.Module) -> tuple[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return "ddp", model
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - a torch built without distributed
        return "single", None
    modules = list(model.modules())
    if any(isinstance(m, FullyShardedDataParallel) for m in modules):
        return "fsdp1", None
    if any(isinstance(m, FSDPModule) for m in modules):
        return "fsdp", None
    if any(is_dtensor(p) for p in model.parameters()):
        return "dtensor", None
    return "single", None


def layout(model: torch.nn.Module) -> str:
    """``ddp``, ``fsdp``, ``dtensor`` or ``single`` (see the module docstring)."""
    kind, _ = _wrapped(model) if torch.distributed.is_available() else ("single", None)
    return "fsdp" if kind == "fsdp1" else kind


def _mesh(mesh: Any) -> dict[str, Any]:
    return {
        "device_type": mesh.device_type,
        "shape": list(mesh.shape),
        "dim_names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
        "ranks": mesh.mesh.tolist(),
    }


def placements(tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"dtensors": {name: {"placements": ["S(0)"], "mesh": "0"}}, "meshes": {"0": {...}}}`` for
    the DTensors among ``tensors`` (a mesh: device type, shape, dimension names and the global rank
    at each coordinate); ``{}`` when there are none."""
    dtensors: dict[str, Any] = {}
    meshes: dict[str, dict[str, Any]] = {}
    seen: dict[int, str] = {}
    for name, tensor in tensors.items():
        if not is_dtensor(tensor):
            continue
        mesh = tensor.device_mesh
        if id(mesh) not in seen:
            described = _mesh(mesh)
            seen[id(mesh)] = next(
                (k for k, m in meshes.items() if m == described), str(len(meshes))
            )
            meshes[seen[id(mesh)]] = described
        dtensors[name] = {"placements": [str(p) for p in tensor.placements], "mesh": seen[id(mesh)]}
    return {"dtensors": dtensors, "meshes": meshes} if dtensors else {}


def model_placements(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """:func:`placements` of a model's parameters and buffers, for its recorded structure."""
    return placements({**dict(model.named_parameters()), **dict(model.named_buffers())})


def _rank_local_buffers(model: torch.nn.Module, wrapper: Any) -> list[str]:
    if wrapper is not None and not getattr(
        wrapper, "forward_sync_buffers", getattr(wrapper, "broadcast_buffers", True)
    ):
        return [name for name, _ in model.named_buffers()]
    found = []
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(
            module, torch.nn.SyncBatchNorm
        ):
            names = [
                name
                for name in ("running_mean", "running_var")
                if getattr(module, name) is not None
            ]
            found += [f"{prefix}.{name}" if prefix else name for name in names]
    return found


def describe(model: torch.nn.Module, info: RankInfo) -> dict[str, Any]:
    """``run.json``'s ``distributed``: world size, backend, layout, mesh, what is replicated, the
    launcher."""
    kind, wrapper = _wrapped(model)
    placements = model_placements(model)
    meshes = list(placements.get("meshes", {}).values())
    replicated = {"ddp": "all", "fsdp": "dtensor", "dtensor": "dtensor"}.get(kind, "none")
    local_world = _env_int("LOCAL_WORLD_SIZE")
    nodes = _env_int("GROUP_WORLD_SIZE")
    return {
        "world_size": info.world_size,
        "backend": info.backend,
        "layout": "fsdp" if kind == "fsdp1" else kind,
        "mesh": meshes[0] if meshes else None,
        "replicated": replicated,
        "rank_local": _rank_local_buffers(model, wrapper) if replicated != "none" else [],
        "launcher": {
            "torchrun": "TORCHELASTIC_RUN_ID" in os.environ,
            "nproc_per_node": local_world,
            "nnodes": nodes
            if nodes is not None
            else (info.world_size // local_world if local_world else None),
            "run_id": uuid.uuid4().hex,
        },
    }


def _replica_group(model: torch.nn.Module) -> list[int] | None:
    kind, wrapper = _wrapped(model)
    if kind != "ddp":
        return None
    group = getattr(wrapper, "process_group", None)
    try:
        return list(torch.distributed.get_process_group_ranks(group)) if group is not None else None
    except (RuntimeError, ValueError):
        return None


def rank_identity(model: torch.nn.Module, info: RankInfo) -> dict[str, Any]:
    """``rank{r}/rank.json`` (less the environment, which the recorder adds): who this rank is and
    where it ran."""
    device = (
        f"cuda:{torch.cuda.current_device()}"
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else "cpu"
    )
    return {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "backend": info.backend,
        "hostname": platform.node(),
        "pid": os.getpid(),
        "device": device,
        "replica_group": _replica_group(model),
        "node": _env_int("GROUP_RANK"),
        "nnodes": _env_int("GROUP_WORLD_SIZE"),
        "local_world_size": _env_int("LOCAL_WORLD_SIZE"),
    }
