"""The fix for each kind of thing that makes PyTorch runs differ, in words: shared by ``compare``
and ``doctor``.

Each function turns what an experiment or a check named (streams, seeding calls, a loader's
settings, an op, environment keys, a generator, config values) into the advice a report prints.
Each fix is drawn from what PyTorch documents about reproducibility: seeding every stream, a
seeded ``generator=`` and ``worker_init_fn`` for DataLoader, ``torch.use_deterministic_algorithms``,
cuDNN autotuning and determinism, ``CUBLAS_WORKSPACE_CONFIG``, TF32, thread counts and
``PYTHONHASHSEED``. Which fix a verdict's cause calls for is the cause's own
(:mod:`bisect_repro.diagnose.compare.causes`).

Where the guarantees stop: the advice names what to change, never checks that the change is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..capture.seeding import SeedingCall

__all__ = [
    "resume_fix",
    "alert_fix",
    "config_value",
    "config_values",
    "data_fix",
    "environment_fix",
    "generator_fix",
    "hidden_state_fix",
    "op_fix",
    "stream_fix",
]


_STREAM_FIXES = {
    "python": "random.seed(seed)",
    "numpy": "np.random.seed(seed) (or draw from a seeded np.random.default_rng(seed))",
    "torch": "torch.manual_seed(seed)",
    "loader.generator": "DataLoader(..., generator=torch.Generator().manual_seed(seed))",
    "sampler.generator": "give the sampler a seeded generator: torch.Generator().manual_seed(seed)",
}


_RESEED_FIXES = {
    "torch": "torch.manual_seed(seed)",
    "cuda": "torch.cuda.manual_seed_all(seed)",
    "python": "random.seed(seed)",
    "random.Random": "random.Random(seed)",
    "numpy": "np.random.seed(seed)",
    "new numpy Generator": "np.random.default_rng(seed)",
}


def stream_fix(
    streams: Sequence[str], *, resumed: bool = False, reseeds: Sequence[SeedingCall] = ()
) -> str:
    """How to seed the named streams alike in both runs; ``reseeds``: the entropy seeding calls to
    remove."""
    if reseeds:
        calls = "; ".join(dict.fromkeys(r.describe() for r in reseeds))
        seeded = "; ".join(
            dict.fromkeys(_RESEED_FIXES.get(r.stream, "a seed of your own") for r in reseeds)
        )
        return f"remove the reseeding from entropy ({calls}), or give it a seed: {seeded}"
    parts = []
    for name in streams:
        if name.startswith("cuda:"):
            parts.append("torch.cuda.manual_seed_all(seed)")
        else:
            parts.append(
                _STREAM_FIXES.get(name, f"seed the generator {name!r} where the recipe creates it")
            )
    advice = (
        "seed every stream the same way in both runs, before building the model and the data: "
        + "; ".join(dict.fromkeys(parts))
    )
    if resumed:
        advice = (
            "restore every random stream from the checkpoint when resuming (Python, NumPy, torch, "
            "CUDA, the loader's generator); or " + advice
        )
    return advice


def data_fix(loader: Mapping[str, Any], *, order: bool, resumed: bool = False) -> str:
    """How to make the batches alike: restore the data position on resume, shuffle from a seeded
    stream (``order``: the samples differ), or seed what draws the augmentation."""
    workers = int(loader.get("num_workers") or 0)
    if resumed:
        return (
            "restore the data position when resuming: resume at an epoch boundary, or use a loader "
            "whose state a checkpoint "
            "holds (torchdata's StatefulDataLoader), and restore torch's random state and the "
            "loader's generator with it"
        )
    if order:
        return (
            "shuffle from a seeded stream: DataLoader(..., shuffle=True, "
            "generator=torch.Generator().manual_seed(seed)); "
            "with DistributedSampler, the same seed in both runs and sampler.set_epoch(epoch) each "
            "epoch; "
            "keep batch_size, drop_last and the sampler the same"
        )
    if workers:
        return (
            "seed the augmentation in the workers: DataLoader(..., "
            "generator=torch.Generator().manual_seed(seed), "
            "worker_init_fn=seed_worker) where seed_worker seeds numpy and random from "
            "torch.initial_seed() % 2**32; "
            "keep num_workers the same in both runs"
        )
    return (
        "seed the streams the dataset draws from (random.seed, np.random.seed, torch.manual_seed), "
        "or give the dataset a seeded generator of its own"
    )


def op_fix(op: str | None) -> str:
    """How to make an op (``None``: any op) compute the same on identical inputs."""
    advice = (
        "torch.use_deterministic_algorithms(True) before training (on CUDA also set "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8, "
        "torch.backends.cudnn.deterministic = True and torch.backends.cudnn.benchmark = False)"
    )
    if op and any(name in op for name in ("index_put", "index_add", "scatter", "_index_put_impl")):
        advice += (
            "; or gather with torch.nn.functional.embedding / a deterministic formulation "
            "instead of accumulating by index"
        )
    return advice


_ENVIRONMENT_FIXES = {
    "torch.get_num_threads": "pin the thread count in both runs: torch.set_num_threads(N) and "
    "OMP_NUM_THREADS=N",
    "env.OMP_NUM_THREADS": "set OMP_NUM_THREADS to the same value in both runs",
    "env.MKL_NUM_THREADS": "set MKL_NUM_THREADS to the same value in both runs",
    "torch.are_deterministic_algorithms_enabled": "call torch.use_deterministic_algorithms(True) "
    "in both runs",
    "torch.backends.cudnn.benchmark": "torch.backends.cudnn.benchmark = False in both runs "
    "(autotuning picks kernels by timing)",
    "torch.backends.cudnn.deterministic": "torch.backends.cudnn.deterministic = True in both runs",
    "torch.backends.cuda.matmul.allow_tf32": "torch.backends.cuda.matmul.allow_tf32 = False (TF32 "
    "rounds matmuls on Ampere and later)",
    "torch.backends.cudnn.allow_tf32": "torch.backends.cudnn.allow_tf32 = False (TF32 rounds "
    "convolutions on Ampere and later)",
    "torch.get_float32_matmul_precision": "torch.set_float32_matmul_precision('highest') in both "
    "runs",
    "env.CUBLAS_WORKSPACE_CONFIG": "export CUBLAS_WORKSPACE_CONFIG=:4096:8 in both runs",
    "env.PYTHONHASHSEED": "export PYTHONHASHSEED=0 in both runs (set iteration order depends on "
    "it)",
    "torch": "run both with the same torch version",
    "cuda": "run both with the same CUDA version",
    "cudnn": "run both with the same cuDNN version",
    "devices": "run both on the same GPU model, or accept differences at rounding level",
}


def environment_fix(keys: Sequence[str]) -> str:
    """How to make the named environment keys the same in both runs."""
    fixes = [_ENVIRONMENT_FIXES[k] for k in keys if k in _ENVIRONMENT_FIXES]
    if not fixes:
        fixes = (
            [f"make {', '.join(keys)} the same in both runs"]
            if keys
            else ["run both in the same environment"]
        )
    return "; ".join(dict.fromkeys(fixes))


_GENERATOR_SEEDING = {
    "numpy.random.Generator": "np.random.default_rng(seed)",
    "numpy.random.RandomState": "np.random.RandomState(seed)",
    "random.Random": "random.Random(seed)",
    "torch.Generator": "torch.Generator().manual_seed(seed)",
}


def generator_fix(name: str, kind: str, *, workers: int = 0) -> str:
    """How to seed a generator the recipe keeps inside its dataset or sampler (``name`` its
    attribute path)."""
    advice = (
        f"create {name} from a seed: "
        f"{_GENERATOR_SEEDING.get(kind, 'a generator seeded from the recipe seed')}"
    )
    if workers:
        advice += (
            f"; with num_workers={workers} every worker starts from a copy of it, so also reseed "
            "it in worker_init_fn "
            "from torch.initial_seed() (each worker gets its own seed, and the same one in every "
            "run)"
        )
    return advice


def alert_fix(op: str | None, message: str) -> str:
    """What to do about an op PyTorch reports as having no deterministic implementation."""
    if "CUBLAS_WORKSPACE_CONFIG" in message:
        return (
            environment_fix(["env.CUBLAS_WORKSPACE_CONFIG"])
            + " (before Python starts; cuBLAS reads it once)"
        )
    return (
        f"PyTorch has no deterministic kernel for {op or 'this op'} on this device: compute it "
        "another way (e.g. sort the "
        "indices, or gather instead of scatter), or keep it and accept run-to-run differences; "
        "under "
        "torch.use_deterministic_algorithms(True) it raises, with warn_only=True it only warns"
    )


def hidden_state_fix() -> str:
    """How to keep what a step reads where a checkpoint holds it."""
    return (
        "keep what the step reads in the Trainee: Trainee(state={'name': obj}) for objects with "
        "state_dict()/load_state_dict() "
        "(saved, restored and hashed with the rest), and bisect_repro.current_step() instead of a "
        "counter of your own"
    )


def config_value(value: Any) -> str:
    """A config value or argument as a verdict shows it (``unset`` where a run does not set it, or
    sets it to ``None``)."""
    return "unset" if value is None else repr(value)


def config_values(config: Mapping[str, Sequence[Any]], keys: Sequence[str]) -> list[str]:
    """Each key with both runs' values: ``--gamma 0.7 in run A, 0.5 in run B``."""
    return [
        f"{k} {config_value(config[k][0])} in run A, {config_value(config[k][1])} in run B"
        if k in config
        else k
        for k in keys
    ]


def resume_fix(parts: Sequence[str]) -> str:
    """How to make a resume restore the parts of the training state it missed (the resume audit's
    names: ``optimizer``, ``optimizer1``, ``optimizer settings``, ``state.NAME``)."""
    named = ", ".join(_state_part(part) for part in parts) or "every part of the training state"
    return (
        f"save {named} in the checkpoint and load it when resuming: each optimizer's "
        "`state_dict()` / `load_state_dict()`, and each scheduler's, scaler's or EMA copy's alike"
    )


def _state_part(part: str) -> str:
    if part == "optimizer settings":
        return "the optimizers' settings"
    if part.startswith("state."):
        return f"the state of {part.removeprefix('state.')}"
    return f"the state of {part}"
