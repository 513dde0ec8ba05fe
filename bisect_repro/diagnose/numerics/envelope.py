"""The noise envelope, by experiment: how far rounding alone moves run A's training.

Run A is recorded again, in a fresh process, from its first checkpoint to its last step with the
same snapshots, with the rounding changed and nothing else (the data, the streams, the settings
and the code are A's, restored from the checkpoint); the distance of that replay from run A at
each snapshot is the envelope. What changes, in order (the first that moves the weights at all;
``itself`` alone where it applies, since any other change would be read through that op's noise):

- ``itself``: nothing changes, where the compare proved run A differs from itself (a
  nondeterministic op); it moves the weights where that op adds;
- ``tf32``: run B's TF32 switches and variables, where they differ from run A's; it moves the
  matmuls and convolutions on a GPU;
- ``threads``: torch's intra-op thread count, run B's where it differs from run A's, else 1 and 2
  swapped; it moves the reductions that torch splits across threads;
- ``ulp``: every floating-point parameter one ulp up, at the first step; it moves everything, for
  a training exact under any thread count.

Where an experiment cannot run (no launch to replay, no checkpoint, a replay that fails), no
envelope is measured, and why names that experiment.

The replay is run A's own launch (:class:`~bisect_repro.replay.launch.LaunchSpec`: its recipe,
checked by hash, its recorded numeric variables), and runs only where compare replays: with the
user's consent for a run not recorded here. The replayed run is written to a temporary folder and
deleted.

A distributed run A is replayed on its own world size under ``torchrun``, each rank from its own
checkpoint; its distance is that of the whole run
(:func:`~bisect_repro.diagnose.numerics.numerics.run_sketches`).

Where the guarantees stop: recipes only (a script's loop has no entry point to record it again
from a checkpoint), on one node; the replay costs another training from the first
checkpoint to the end; the ``ulp`` experiment wraps the step function, so counters a recipe keeps
in its step function's module are not restored there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...record.autohooks import one_ulp_up
from ...record.torchrun import init_process_group, torchrun_command
from ...replay.launch import LaunchSpec
from ...store.meta import CodeKind
from ...store.run import Run
from ..compare.records import Records, rank_zero_alike
from .numerics import (
    FLOOR,
    ExactSignal,
    Measured,
    add_exact,
    decide,
    distances,
    signals_differing,
)
from .numerics_result import Envelope, Numerics

__all__ = ["experiments", "judge", "measure_envelope", "tf32_of"]

_JOB = "BISECT_REPRO_ENVELOPE"


TF32_SWITCHES = (
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
    "torch.get_float32_matmul_precision",
)
TF32_VARIABLES = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
_PRECISIONS = ("highest", "high", "medium")


_TF32 = tuple[dict[str, Any], dict[str, str | None]]
"""Run B's TF32 switches (by fingerprint key) and variables (by name; ``None``: unset)."""


def tf32_of(a: Run, b: Run) -> _TF32 | None:
    """Run B's TF32 switches and variables where they differ from run A's (``None`` where none
    does): what the ``tf32`` experiment replays run A with. Only values a switch can take pass (a
    bool; a matmul precision torch names); variables go through the launch's own checks."""
    ours, theirs = a.environment, b.environment
    switches = {k: theirs.get(k) for k in TF32_SWITCHES if theirs.get(k) != ours.get(k)}
    switches = {k: v for k, v in switches.items() if isinstance(v, bool) or v in _PRECISIONS}
    variables = {
        n: theirs.get(f"env.{n}")
        for n in TF32_VARIABLES
        if theirs.get(f"env.{n}") != ours.get(f"env.{n}")
    }
    return (switches, variables) if switches or variables else None


def measure_envelope(
    run: Run, spec: LaunchSpec | None, other: Run | None = None, unrepeatable: str | None = None
) -> tuple[Envelope | None, str | None]:
    """Run A's envelope, or ``None`` with why it could not be measured (the experiment that could
    not run, and why); ``other``: run B, whose TF32 settings the ``tf32`` experiment takes and
    whose thread count the ``threads`` one does; ``unrepeatable``: the op by which the compare
    proved run A differs from itself, if it did."""
    threads = _threads(run) or torch.get_num_threads()
    tf32 = tf32_of(run, other) if other is not None else None
    theirs = _threads(other) if other is not None else None
    tried = experiments(threads, tf32, unrepeatable, theirs)
    unable = _unreplayable(run, spec)
    if unable is not None or spec is None:
        return None, f"replaying run A with {tried[0][0]} could not run: {unable}"
    # a script recorded unchanged runs again from its own start
    start = min(run.checkpoints) if spec.kind is CodeKind.RECIPE else min(run.snapshots)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-envelope-") as folder:
        for index, (method, change, last) in enumerate(tried):
            try:
                measured = _replayed(run, spec, start, Path(folder) / str(index), change)
            except _Failed as error:
                return None, f"replaying run A from step {start} with {method} failed: {error}"
            if last or any(p.relative != 0 for p in measured.weights):
                return Envelope(
                    method=method,
                    from_step=start,
                    points=measured.weights,
                    activations=measured.activations,
                ), None
    raise AssertionError("unreachable: the last experiment returns")


def _threads(run: Run) -> int | None:
    """The intra-op thread count a run recorded, where it did."""
    threads = run.environment.get("torch.get_num_threads")
    return threads if isinstance(threads, int) and threads > 0 else None


def _unreplayable(run: Run, spec: LaunchSpec | None) -> str | None:
    """Why run A cannot be recorded again to measure its envelope; ``None`` where it can."""
    if spec is None:
        return "run A is not replayed (no consent, --no-replay, or no launch recorded)"
    if spec.kind is CodeKind.RECIPE and spec.target is None:
        return "run A names no recipe to replay"
    if spec.kind is not CodeKind.RECIPE and not spec.auto:
        return "run A records itself (the Recorder API): it is not run again to measure"
    if spec.kind is CodeKind.RECIPE and not run.checkpoints:
        return "run A has no checkpoint to replay from"
    return None


def experiments(
    threads: int, tf32: _TF32 | None, unrepeatable: str | None, theirs: int | None = None
) -> list[tuple[str, _Change, bool]]:
    """The experiments to try, in order, each with its method as the sentence names it and
    whether it is the last (the table of the module docstring); ``theirs``: run B's thread count,
    taken by the ``threads`` experiment where it differs from run A's ``threads`` (else 1 and 2
    swapped)."""
    if unrepeatable is not None:
        return [
            (
                f"nothing changed (run A differs from itself: {unrepeatable})",
                _Change(threads=threads),
                True,
            )
        ]
    swapped = theirs if theirs is not None and theirs != threads else 2 if threads == 1 else 1
    found = [] if tf32 is None else [(_tf32_method(*tf32), _Change(threads=threads, tf32=tf32))]
    found += [
        (f"{swapped} torch threads instead of {threads}", _Change(threads=swapped)),
        ("every weight moved one ulp", _Change(threads=threads, perturb=True)),
    ]
    return [(method, change, i == len(found) - 1) for i, (method, change) in enumerate(found)]


@dataclass(frozen=True, kw_only=True)
class _Change:
    """What one experiment changes in run A's replay."""

    threads: int
    perturb: bool = False
    tf32: _TF32 | None = None


def _tf32_method(switches: dict[str, Any], variables: dict[str, str | None]) -> str:
    named = [
        *(f"{k}={v}" for k, v in switches.items()),
        *(f"{n}={v if v is not None else '(unset)'}" for n, v in variables.items()),
    ]
    return f"run B's TF32 settings ({', '.join(named)})"


def judge(
    records: Records,
    spec: LaunchSpec | None,
    unrepeatable: str | None = None,
    *,
    asked: bool = False,
) -> Numerics:
    """The ``numerics`` of two runs: their distance from the sketches, run A's envelope and the
    decision. The envelope (another training of run A, where ``spec`` may replay it) and the exact
    distances (four checkpoints read whole) are measured only where the verdict needs them: where
    the records cannot tell that the runs part by an event rather than by rounding from the start
    (:func:`_not_rounding`), or where the user asked (``asked``: ``compare --numerics``). An exact
    signal that differs is measured against the envelope of the runs' environments where those
    differ too (run A under run B's), so that the departure it causes is found beyond their
    rounding. Runs of another
    world size are matched step by step (the same global batch at each step is assumed: each rank's
    batches and streams differ by design, so of the exact signals only the config is compared)."""
    measured = distances(records.a, records.b, exact=False)
    signals = signals_differing(records, config_only=records.a.world_size != records.b.world_size)
    if measured is not None and all(p.relative == 0 for p in measured.weights) and not signals:
        return Numerics(
            rounding_only=True,
            distance=measured.weights,
            sentence="the runs' weights are equal at every snapshot: no rounding to measure",
        )
    unmeasured = _not_rounding(records, measured, signals) if measured is not None else None
    if unmeasured is not None and not asked:
        return decide(measured, None, signals, unmeasured)
    if measured is not None:
        add_exact(measured, records.a, records.b)
    envelope, why = (
        measure_envelope(records.a, spec, records.b, unrepeatable)
        if measured is not None
        else (None, None)
    )
    return decide(measured, envelope, signals, why)


def _not_rounding(records: Records, measured: Measured, signals: list[ExactSignal]) -> str | None:
    """Why the records alone show that the runs do not differ by rounding from the start, so no
    envelope is measured (it costs another training); ``None`` when only an envelope can tell.

    - an exact signal that differs in environments that differ in nothing that rounds (at most
      in ``_NOT_ROUNDING``): not measured, no rounding differs beside the signal, the cause;
    - different weights at the first snapshot: not measured, training has not rounded anything yet;
    - weights equal bit for bit at a later snapshot: not measured, a discrete divergence (the
      verdict's), unless the runs differ only in settings that change rounding (thread counts,
      TF32), whose rounding may first show after a few equal steps;
    - none of these: measured (with an exact signal that differs, the envelope is the
      environments' difference alone: the departure beyond it is the signal's).

    Where rank 0 of the runs holds other tensors (another layout: FSDP2's shards against DDP's
    whole tensors), their hashes do not compare, and the weights at the first snapshot are the
    same when their sketched distance is within ``FLOOR`` (the sketches of shards add up to the
    whole's, to float64 rounding).
    """
    first = records.timeline[0] if records.timeline else None
    if signals and not set(records.differences.environment) - set(_NOT_ROUNDING):
        return (
            f"{signals[0].what} differ {signals[0].since} and the runs' environments "
            "agree in all that rounds: no rounding differs beside it"
        )
    if first is None:
        return None
    if not rank_zero_alike(records.a, records.b):
        start = measured.weights[0]
        # the hashes do not compare: the sketches do
        first_step, first_equal, last_equal = start.step, start.relative <= FLOOR, None
    else:
        first_step, first_equal, last_equal = first.step, first.equal, records.last_equal
    if not first_equal:
        return (
            f"the runs start from different weights at step {first_step}; rounding in training "
            "cannot explain that"
        )
    if last_equal is not None and last_equal > first_step and not _rounding_settings(records):
        return (
            f"the runs are equal bit for bit up to step {last_equal}: they do not differ by "
            "rounding from the start, "
            "and the verdict explains where they part"
        )
    return None


_NOT_ROUNDING = ("hostname", "bisect_repro", "env.PYTHONHASHSEED")
"""Environment keys that change no floating-point rounding: the machine's name, this tool's
version, Python's hash seed (it changes what is computed, which the exact signals show)."""

_THREADS = ("torch.get_num_threads", "env.OMP_NUM_THREADS", "env.MKL_NUM_THREADS")


def _rounding_settings(records: Records) -> bool:
    """Whether the runs' environments differ, and only in settings that change rounding (thread
    counts, TF32): rounding that may first show after a few equal steps."""
    keys = set(records.differences.environment)
    rounding = {*_THREADS, *TF32_SWITCHES, *(f"env.{n}" for n in TF32_VARIABLES)}
    return bool(keys) and keys <= rounding


class _Failed(Exception):
    """The replay that measures the envelope failed (its last line of output says why)."""


def _replayed(run: Run, spec: LaunchSpec, start: int, out: Path, change: _Change) -> Measured:
    options = run.meta.options
    switches, variables = change.tf32 if change.tf32 is not None else ({}, {})
    if variables:
        spec = spec.with_variables({**spec.variables, **variables})
    job = {
        "source": str(run.path),
        "step": start,
        "steps": run.last_step,
        "every": options.every,
        "target": spec.target,
        "config": spec.config,
        "path": spec.path,
        "root": spec.root,
        "threads": change.threads,
        "perturb": change.perturb,
        "switches": switches,
        "out": str(out),
        "script": None
        if spec.kind is CodeKind.RECIPE
        else {
            "kind": spec.kind.value,
            "path": spec.path,
            "module": spec.module,
            "argv": list(spec.argv),
            "sha256": spec.sha256,
        },
    }
    environment = {**os.environ, _JOB: json.dumps(job)}
    for name, value in spec.variables.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    cwd = spec.cwd if spec.cwd and Path(spec.cwd).is_dir() else str(out.parent)
    launcher = torchrun_command(run.world_size) if run.distributed is not None else [sys.executable]
    done = subprocess.run(
        [*launcher, "-m", __name__],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise _Failed(last)
    return distances(run, Run.open(out), exact=False) or Measured()


class _Perturbed:
    """A step function that first moves every floating-point parameter one ulp up."""

    def __init__(self, step: Any, model: torch.nn.Module) -> None:
        self.step, self.model, self.done = step, model, False

    def __call__(self, batch: Any) -> Any:
        if not self.done:
            one_ulp_up(self.model)
            self.done = True
        return self.step(batch)


def _main() -> None:
    """The replay process: run A recorded again from its checkpoint, as the job says."""
    from ...capture import env
    from ...record.options import RecordOptions
    from ...record.recipe import build
    from ...record.recorder import record

    job = json.loads(os.environ[_JOB])
    if job["root"]:
        sys.path.insert(0, job["root"])
    # under torchrun: one rank of A's world
    rank = int(os.environ.get("RANK", "0")) if "LOCAL_RANK" in os.environ else 0
    ours = init_process_group() if "LOCAL_RANK" in os.environ else False
    environment = dict(Run.open(job["source"], rank).environment)
    environment["torch.get_num_threads"] = job["threads"]
    env.apply({**environment, **job["switches"]})
    if job.get("script"):
        _script(job)
        return
    trainee = build(job["target"], job["config"], expected=Path(job["path"]))
    if job["perturb"]:
        trainee.step = _Perturbed(trainee.step, trainee.model)
    options = RecordOptions(
        steps=job["steps"], every=job["every"], checkpoint_every=None, force=True
    )
    record(
        trainee,
        job["out"],
        options,
        target=job["target"],
        config=job["config"],
        resume_from=(job["source"], job["step"]),
    )
    if ours:
        import torch.distributed as dist

        dist.destroy_process_group()


def _script(job: dict[str, Any]) -> None:
    """Run A's script recorded again from its start, under the same hooks, in this process: the
    checked bytes (as a replay runs them), the same snapshots, the rounding changed as the job
    says."""
    from ...record.autohooks import AutoHooks
    from ...record.options import RecordOptions
    from ...record.pinned import pin
    from ...record.script import ScriptCommand, run_as_main

    script = job["script"]
    if script["path"] and script["sha256"]:
        pin(script["path"], script["sha256"])
    command = ScriptCommand(
        kind=CodeKind(script["kind"]),
        path=script["path"],
        module=script["module"],
        argv=tuple(script["argv"]),
    )
    options = RecordOptions(every=job["every"], checkpoint_every=None, force=True)
    hooks = AutoHooks(job["out"], options, perturb=job["perturb"]).install()
    failed = True
    try:
        run_as_main(command)
        failed = False
    except SystemExit as exit_:
        failed = exit_.code not in (None, 0)
    finally:
        hooks.close(failed=failed)


if __name__ == "__main__":
    _main()
