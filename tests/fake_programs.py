"""Step functions and loaders for :class:`~tests.fake_replica.Program`, and runs recorded from a
program.

A stream's state is a number: a draw adds one. :func:`one_layer` is the step of a one-layer model
whose every part a test can perturb (what the forward depends on, a nondeterministic kernel, a
Python argument, a branch, the learning rate, the streams it draws from); :func:`reseed` is
``torch.seed()`` inside a step. :func:`record` runs a program from step 0 and writes what it
computed through the store, as the recorder would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.capture.trace import OpRecord, TraceEntry
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.store.run import Run
from tests.fake_replica import Batch, Call, FakeReplica, Outcome, Program, digest
from tests.fakes import write_run


def shuffled(stream: str = "loader.generator") -> Callable[[int, Mapping[str, Any]], Batch]:
    """A loader that picks each batch's sample with one draw from ``stream``."""

    def loader(position: int, streams: Mapping[str, Any]) -> Batch:
        index = int(digest(stream, streams[stream], position), 16) % 1000
        return Batch([index], digest("sample", index), {**streams, stream: streams[stream] + 1})

    return loader


def reseed(
    call: Call, where: str = "train.py:12", *, stream: str = "torch"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The streams after ``torch.seed()`` at ``where`` (from entropy, unless it is fixed), and the
    call."""
    seed = call.entropy if call.fixed_entropy is None else call.fixed_entropy
    return {**call.streams, stream: seed}, SeedingCall(
        stream, "torch.seed()", True, where
    ).to_json()


def reseeding(call: Call) -> Outcome:
    """:func:`one_layer` after ``torch.seed()`` at ``train.py:12``."""
    streams, seeded = reseed(call, "train.py:12")
    return one_layer(call, streams=streams, seeding=[seeded])


def only_at(step: int, code: Callable[[Call], Outcome]) -> Callable[[Call], Outcome]:
    """A step function that runs ``code`` at ``step`` and :func:`one_layer` at every other step."""
    return lambda call: code(call) if call.step == step else one_layer(call)


def one_layer(
    call: Call,
    *,
    streams: Mapping[str, Any] | None = None,
    forward: Any = None,
    kernel: Any = None,
    lr: Any = None,
    scale: str = "1.0",
    branch: bool = False,
    seeding: Iterable[dict[str, Any]] = (),
) -> Outcome:
    """A step of a one-layer model ``fc`` with dropout: a matmul of its weight and the batch (and
    ``forward``, whatever else it depends on), a dropout mask drawn from ``torch`` (from
    ``streams``, the call's by default), a multiplication by ``scale`` (a Python argument), a
    gradient from an ``index_add`` (whose output ``kernel`` also decides, when the kernel is
    nondeterministic), and the weight after an SGD step with ``lr`` (the config's by default);
    ``branch``: an extra layer ``fc2`` runs."""
    streams = dict(call.streams if streams is None else streams)
    weight = call.state["fc.weight"]
    lr = (call.spec.config if call.spec else {}).get("lr", 0.1) if lr is None else lr
    hidden = digest("mm", weight, call.batch, forward)
    mask = digest("bernoulli", hidden, streams.get("torch"))
    out = digest("mul", hidden, mask, scale)
    grad = digest("index_add", out, kernel)
    new_weight = digest("sgd", weight, grad, lr)
    if "torch" in streams:
        streams["torch"] += 1
    entries = [TraceEntry("forward", "fc", "fc.output", out)]
    if branch:
        entries.append(TraceEntry("forward", "fc2", "fc2.output", digest("fc2", out)))
    entries += [
        TraceEntry("backward", "fc", "fc.weight.grad", grad),
        TraceEntry("optimizer", "fc", "fc.weight", new_weight),
    ]
    ops = [
        OpRecord("aten.mm.default", "fc", (weight, call.batch), (hidden,), "", "forward"),
        OpRecord("aten.bernoulli_.float", "fc", (hidden,), (mask,), "0.5", "forward"),
        OpRecord("aten.mul.Tensor", "fc", (hidden, mask), (out,), scale, "forward"),
        OpRecord("aten.index_add_.default", "fc", (out,), (grad,), "0", "backward"),
    ]
    return Outcome(entries, streams, loss=int(out[:6], 16) / 2**24, ops=ops, seeding=list(seeding))


def record(
    program: Program,
    path: Path,
    *,
    steps: int,
    every: int = 1,
    checkpoints: Iterable[int] = (0,),
    spec: LaunchSpec | None = None,
) -> Run:
    """What ``program`` computes from step 0 to ``steps``, written as a run directory: each step's
    line (loss, order, batch, the seeding calls from entropy), a snapshot of the state and the
    streams every ``every`` steps and at the end, and the ``checkpoints``."""
    # what a framework's loop computes alike
    process = FakeReplica(replace(program, reruns=True), "recording", spec)
    process.connect()
    lines, snapshots, saved = [], {}, {}
    for step in range(steps + 1):
        now = {
            "hashes": process.hashes(),
            "streams": dict(process.rng),
            "data": dict(process.cursor),
        }
        if step % every == 0 or step == steps:
            snapshots[step] = now
        if step in checkpoints:
            saved[step] = now
        if step == steps:
            break
        fetched = process.fetch()
        result = process.run(step, commit=True)
        order = fetched.order if program.reruns else None
        line: dict[str, Any] = {
            "step": step,
            "loss": result.loss,
            "order": order,
            "batch": fetched.batch,
        }
        if entropy := [call for call in result.seeding if call.get("entropy")]:
            line["seeded"] = entropy
        lines.append(line)
    config = spec.config if spec is not None else {}
    return write_run(path, lines, snapshots, saved, config=config, environment=program.environment)
