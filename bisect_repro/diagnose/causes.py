"""What is known about why PyTorch runs differ, and the fix for each cause: the one table.

:class:`Cause` is the value of ``verdict.cause`` in ``compare --json``; :data:`CAUSES` holds, for
each, its title and what it means, and :func:`fix_for` the fix, given what the experiments named
(the streams, the keys, the op, the seeding call sites). ``doctor``'s findings use the same
advice. Each fix is drawn from what PyTorch documents about reproducibility: seeding every
stream, a seeded ``generator=`` and ``worker_init_fn`` for DataLoader,
``torch.use_deterministic_algorithms``, cuDNN autotuning and determinism,
``CUBLAS_WORKSPACE_CONFIG``, TF32, thread counts and ``PYTHONHASHSEED``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..capture.seeding import SeedingCall

__all__ = [
    "CAUSES",
    "Cause",
    "alert_fix",
    "cause_title",
    "config_value",
    "config_values",
    "explanation_for",
    "data_fix",
    "environment_fix",
    "fix_for",
    "generator_fix",
    "op_fix",
    "stream_fix",
]


class Cause(str, Enum):
    """Why two runs part ways (``verdict.cause``)."""

    RNG_STATE = "rng_state"
    DATA_ORDER = "data_order"
    DATA_CONTENT = "data_content"
    NONDETERMINISTIC_OP = "nondeterministic_op"
    ENVIRONMENT = "environment"
    CONFIG = "config"
    STRUCTURE = "structure"
    HIDDEN_STATE = "hidden_state"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CauseInfo:
    title: str
    """How the report names it."""
    meaning: str
    """What it means, in one sentence."""


CAUSES: dict[Cause, CauseInfo] = {
    Cause.RNG_STATE: CauseInfo(
        "a random stream not seeded alike",
        "a random stream (Python, NumPy, torch, CUDA, a loader's or the recipe's generator) was in "
        "different states, "
        "or was reseeded from entropy",
    ),
    Cause.DATA_ORDER: CauseInfo("the data order", "the batches held different samples"),
    Cause.DATA_CONTENT: CauseInfo(
        "the data content", "the same samples gave different tensors (augmentation, workers)"
    ),
    Cause.NONDETERMINISTIC_OP: CauseInfo(
        "a nondeterministic op",
        "an op gave different outputs on identical inputs (atomic adds, a kernel picked by timing)",
    ),
    Cause.ENVIRONMENT: CauseInfo(
        "the environment",
        "a setting differed: thread count, determinism or TF32 switches, matmul precision, a "
        "variable, a version",
    ),
    Cause.CONFIG: CauseInfo("the config", "the runs were built with different settings"),
    Cause.STRUCTURE: CauseInfo(
        "the model structure", "the models' parameters or buffers differ in name, shape or dtype"
    ),
    Cause.HIDDEN_STATE: CauseInfo(
        "state outside what was recorded",
        "the step reads state that no checkpoint holds (a counter in a closure, a global, the "
        "clock), so it does not repeat",
    ),
    Cause.UNKNOWN: CauseInfo("an unknown cause", "no experiment explained the difference"),
}

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


def cause_title(cause: str) -> str:
    """How a report names a cause (``rng_state``: a random stream not seeded alike)."""
    try:
        return CAUSES[Cause(cause)].title
    except ValueError:
        return cause


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


def data_fix(cause: str, loader: Mapping[str, Any], *, resumed: bool = False) -> str:
    workers = int(loader.get("num_workers") or 0)
    if resumed:
        return (
            "restore the data position when resuming: resume at an epoch boundary, or use a loader "
            "whose state a checkpoint "
            "holds (torchdata's StatefulDataLoader), and restore torch's random state and the "
            "loader's generator with it"
        )
    if cause == "data_order":
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


def environment_fix(keys: list[str]) -> str:
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


def fix_for(
    cause: Cause,
    *,
    streams: Sequence[str] = (),
    reseeds: Sequence[SeedingCall] = (),
    resumed: bool = False,
    loader: Mapping[str, Any] | None = None,
    op: str | None = None,
    keys: Sequence[str] = (),
    config: Mapping[str, Sequence[Any]] | None = None,
) -> str:
    """The fix for a cause, given what the experiments named."""
    if cause is Cause.RNG_STATE:
        return stream_fix(streams, resumed=resumed, reseeds=reseeds)
    if cause in (Cause.DATA_ORDER, Cause.DATA_CONTENT):
        advice = data_fix(cause.value, loader or {}, resumed=resumed)
        return (
            (stream_fix(streams, reseeds=reseeds) + "; " + advice)
            if streams and cause is Cause.DATA_CONTENT
            else advice
        )
    if cause is Cause.NONDETERMINISTIC_OP:
        return op_fix(op)
    if cause is Cause.ENVIRONMENT:
        return environment_fix(list(keys))
    if cause is Cause.CONFIG:
        shown = ", ".join(
            f"{k}: {config_value(v[0])} vs {config_value(v[1])}"
            for k, v in (config or {}).items()
            if not keys or k in keys
        )
        return (
            f"record both runs with the same settings ({shown})"
            if shown
            else "record both runs with the same settings"
        )
    if cause is Cause.STRUCTURE:
        return "compare runs of the same model: the same code, settings and versions"
    if cause is Cause.HIDDEN_STATE:
        return hidden_state_fix()
    return (
        "look for state the step reads outside the model, optimizer and data (module globals, "
        "caches, time- or entropy-based values)"
    )


def explanation_for(
    cause: Cause,
    *,
    where: str,
    streams: Sequence[str] = (),
    reseeds: Sequence[SeedingCall] = (),
    keys: Sequence[str] = (),
    data_by: str | None = None,
    reseeded: bool = False,
    between: int | None = None,
    proven: bool = True,
) -> str:
    """What a proven or observed cause means at the place it shows (``where``: step, pass, tensor,
    op); ``reseeded``: the streams ended the step in another state each time it ran from the same
    state (else ``reseeds`` are calls the step logs show before the step, which left the streams it
    draws from apart); ``between``: the step whose data was drawn from a stream reseeded since the
    step before it ended; ``proven``: an experiment made the difference vanish (otherwise no
    sentence says one did)."""
    named = ", ".join(streams or keys)
    if cause is Cause.RNG_STATE and reseeds:
        calls = "; ".join(dict.fromkeys(r.describe() for r in reseeds))
        if between is not None:
            return (
                f"{named} was reseeded from entropy between steps {between - 1} and {between} "
                f"({calls}), and the data of "
                f"step {between} was drawn from it: {where} differs"
            )
        if not reseeded:
            return (
                f"{named} was reseeded from entropy before this step ({calls}), so the runs draw "
                "from it in different states: "
                f"{where} differs, and with run A's streams run B matches"
            )
        return (
            f"{named} is reseeded from entropy during the step ({calls}), so {where} differs "
            "from run to run"
        )
    # no call from entropy was seen: a seed that changes (the clock's), or a call not watched
    if cause is Cause.RNG_STATE and reseeded:
        return (
            f"{named} ends the step in a different state each time the step runs from the same "
            "state: it is reseeded during the "
            f"step from a value that changes, so {where} differs from run to run"
        )
    sentences = {
        Cause.RNG_STATE: f"the runs draw from random streams in different states ({named}): "
        f"{where} differs, and with run A's streams "
        "run B matches",
        Cause.NONDETERMINISTIC_OP: f"the run differs from itself when replayed: {where} gives "
        "different results on identical inputs",
        Cause.HIDDEN_STATE: f"{where} differs, and the step does not repeat from the same restored "
        "state: it reads state outside "
        "what is recorded",
        Cause.ENVIRONMENT: f"the runs' settings differ ({named}): {where} differs, and under run "
        "A's settings run B matches",
        Cause.CONFIG: f"the runs were built with different settings ({named}): {where} differs, "
        "and run B rebuilt with run A's matches",
        Cause.DATA_ORDER: f"the runs fed different samples: {where}",
        Cause.DATA_CONTENT: f"the same samples gave different batch contents: {where}",
    }
    text = sentences.get(
        cause,
        f"{where} differs, and neither the streams, the settings, the environment variables nor "
        "the config explain it",
    )
    if not proven:  # no swap made the difference vanish: claim none
        text = (
            text.split(", and with run A's", 1)[0]
            .split(", and under run A's", 1)[0]
            .split(", and run B rebuilt", 1)[0]
        )
    if cause in (Cause.DATA_ORDER, Cause.DATA_CONTENT) and data_by:
        text += f"; with run A's {data_by} run B fetches run A's batch"
    return text
