"""``doctor``: audit a recipe or a script for every known source of irreproducibility, proving each
by a run.

With a TARGET (or a script's command, ``doctor -- python train.py ARGS``: the same audit, the
script run unchanged, see :mod:`bisect_repro.diagnose.doctor.subjects`), it is built and trained in
two fresh processes (:class:`~bisect_repro.replay.replica.Replica` s, the engine ``compare`` replays
with) that differ only in ``PYTHONHASHSEED``:

1. Across the two: their parameters after the build, their random streams (including generators
   found inside the dataset and samplers), the first batches' sample indices and contents, the
   losses and the state after training (:mod:`bisect_repro.diagnose.doctor.probe`). What differs is
   not seeded (``unseeded-init``, ``unseeded-shuffle``, ``unseeded-stream:<name>``,
   ``unseeded-workers``). A difference no random stream explains is settled by two more processes
   with the same two ``PYTHONHASHSEED`` values: each reproducing its namesake, the recipe depends
   on string hashing (``pythonhashseed``); otherwise on some other entropy (``unseeded-source``).
2. Within the first (:mod:`bisect_repro.diagnose.doctor.checks`): each step run again from the state
   it started from, by the rule ``compare`` uses (:mod:`bisect_repro.diagnose.selfcheck`): a step
   that does not repeat reseeds a stream from entropy (``reseeded-stream:<name>``, with the call
   site), reads state outside the trainee (``hidden-state``: another branch, other ops or other
   Python values in a re-run, such as a counter in a closure), or runs an op that gives different
   outputs on identical inputs (``nondeterministic-op``, with its module, forward or backward).
   Step 0 also runs under ``torch.use_deterministic_algorithms(True)`` (``deterministic-warning``
   for each op PyTorch reports), with each unseeded stream one draw further (which streams the
   steps draw from) and on another thread count (``threads-unpinned``).
3. The settings the recipe leaves in place: cuDNN autotuning, TF32, the thread count
   (:mod:`bisect_repro.diagnose.doctor.audit`).

Severity: ``error`` makes the recipe irreproducible on this machine, ``warning`` will bite
elsewhere (another GPU, core count or launcher), ``info`` is worth knowing. Without a TARGET,
only the environment and process are audited (never an error).

Where guarantees stop: a nondeterministic kernel may agree with itself by chance in the reruns;
only the first ``steps`` steps are run, so randomness that starts later is not seen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...capture import env
from ...capture.rng import GLOBAL_STREAMS
from ...errors import BisectReproError, RecipeError
from ...record.recipe import recipe_file
from ...replay.interface import ReplicaFactory
from .. import advice
from ..stages import run_stage
from .audit import environment_findings
from .checks import RecipeChecks, threads_finding
from .findings import SEVERITIES, Finding, Severity
from .probe import Probe, differences, probe
from .steps import DEFAULT_STEPS
from .subjects import Subject, recipe_subject, script_subject

__all__ = ["DEFAULT_STEPS", "SCHEMA", "DoctorReport", "doctor"]

SCHEMA = "bisect-repro/doctor/1"


@dataclass(kw_only=True)
class DoctorReport:
    """What ``doctor`` found; :meth:`to_json` is the ``bisect-repro/doctor/1`` object."""

    findings: list[Finding]
    """Most severe first."""
    target: str | None
    """The recipe audited, or the script's command line; ``None``: this environment and process."""
    config: dict[str, Any]
    """The ``--set`` settings the recipe was built with."""
    steps: int | None
    """How many steps were run and re-run (``None`` without a recipe)."""
    seconds: float
    environment: dict[str, Any]
    """The environment fingerprint the recipe ran in."""
    notes: list[str] = field(default_factory=list)
    """Stages that failed (:mod:`~bisect_repro.diagnose.stages`): what was not checked, and why."""

    @property
    def reproducible(self) -> bool:
        """No finding is an error: reproducible on this machine (warnings may remain)."""
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "reproducible": self.reproducible,
            "findings": [f.to_json() for f in self.findings],
            "target": self.target,
            "config": self.config,
            "steps": self.steps,
            "seconds": self.seconds,
            "environment": self.environment,
            "notes": self.notes,
        }


_HASH_SEEDS = ("1", "2")
_LOADER_STREAMS = ("loader.generator", "sampler.generator", "batch_sampler.generator")

Progress = Callable[[str], None]


def _short(indices: list[int] | None, limit: int = 6) -> str:
    if indices is None:
        return "?"
    shown = ", ".join(map(str, indices[:limit]))
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"


class _Diagnosis:
    """Turns the probes' differences and the in-process experiments into findings."""

    def __init__(self, a: Probe, b: Probe, local: RecipeChecks, steps: int) -> None:
        self.a, self.b, self.local, self.steps = a, b, local, steps
        self.diff = differences(a, b)
        self.loader = a.built.loader
        self.findings: list[Finding] = []
        self.explained: set[str] = set()  # aspects and streams a finding accounts for
        self.unexplained: list[str] = []

    def _add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    def _digests(self, name: str) -> str:
        return f"{self.a.built.streams[name]} vs {self.b.built.streams[name]}"

    def run(self) -> list[Finding]:
        diff = self.diff
        self._init()
        if diff.order is not None:
            self._order(diff.order)
        elif diff.content is not None:
            self._content(diff.content)
        self._hidden_streams()
        self._streams()
        if diff.final and self._started_alike() and "step" not in self.explained:
            self.unexplained.append(f"the state after {self.steps} steps ({diff.final[0]} first)")
        return self.findings

    def _started_alike(self) -> bool:
        return not self.diff.init and self.diff.order is None and self.diff.content is None

    def _init(self) -> None:
        changed = self.diff.init
        if not changed:
            return
        streams = [s for s in self.diff.streams if s not in _LOADER_STREAMS]
        # what torch.nn initialises from; other streams are judged by what draws from them
        if "torch" in streams:
            streams = ["torch"]
        first = changed[0]
        total = len(self.a.built.init)
        what = (
            f"{first} differs between two builds in separate processes ({len(changed)} of "
            f"{total} parameters and buffers differ)"
        )
        if not streams:
            self.unexplained.append(f"the initial {first}")
            return
        names = ", ".join(f"{s} ({self._digests(s)})" for s in streams)
        evidence = (
            f"{what}; the random streams the initialisation draws from differ after the "
            f"build: {names}"
        )
        self._add(
            Finding(
                "unseeded-init",
                "error",
                evidence,
                advice.stream_fix(streams),
                layer=first.rpartition(".")[0] or None,
            )
        )
        self.explained |= {"init", *streams}

    def _order(self, batch: int) -> None:
        diff, loader = self.diff, self.loader
        indices = (self.a.batches[batch].indices, self.b.batches[batch].indices)
        what = (
            f"batch {batch} holds samples {_short(indices[0])} in one process and "
            f"{_short(indices[1])} in the other"
        )
        streams = [s for s in diff.streams if s in _LOADER_STREAMS]
        if not loader.get("generator") and "torch" in diff.streams:
            streams.append("torch")
        hidden = [h for h in diff.hidden if not h.startswith("loader.dataset")]
        if hidden:
            for name in hidden:
                kind = self.a.built.hidden[name].kind
                evidence = (
                    f"{what}; the sampler draws from {name} ({kind}), which starts in a "
                    "different state in each process"
                )
                self._add(
                    Finding(
                        f"unseeded-stream:{name}",
                        "error",
                        evidence,
                        advice.generator_fix(name, kind),
                    )
                )
            self.explained |= {"order", *hidden}
        elif streams:
            source = (
                "the loader has no generator=, so its sampler shuffles from torch's global stream"
                if streams == ["torch"]
                else f"the sampler shuffles from {', '.join(streams)}"
            )
            evidence = (
                f"{what}; {source}, which is in a different state in each process "
                f"({self._digests(streams[0])})"
            )
            self._add(
                Finding("unseeded-shuffle", "error", evidence, advice.data_fix(loader, order=True))
            )
            self.explained |= {"order", *streams}
        else:
            self.unexplained.append(f"the samples of batch {batch}")

    def _content(self, batch: int) -> None:
        diff, loader = self.diff, self.loader
        workers = int(loader.get("num_workers") or 0)
        indices = self.a.batches[batch].indices
        what = f"batch {batch} holds the same samples {_short(indices)} with different contents"
        hidden = [h for h in diff.hidden if h.startswith("loader.dataset")]
        candidates = [*hidden, *(s for s in diff.streams if s in GLOBAL_STREAMS and not workers)]
        proven = {name: self.local.dataset_draws_from(name, batch) for name in candidates}
        culprits = [name for name, draws in proven.items() if draws] or [
            name for name in hidden if proven[name] is None
        ]
        for name in culprits:
            shown = (
                f"{name} ({self.a.built.hidden[name].kind})"
                if name in self.a.built.hidden
                else f"{name}'s global stream"
            )
            evidence = (
                f"{what}; the dataset draws from {shown}, which starts in a different state "
                "in each process"
            )
            if proven[name]:
                evidence += (
                    "; shown here: with it one draw further, the same samples come out different"
                )
            fix = (
                advice.generator_fix(name, self.a.built.hidden[name].kind, workers=workers)
                if name in self.a.built.hidden
                else advice.stream_fix([name])
            )
            self._add(Finding(f"unseeded-stream:{name}", "error", evidence, fix))
        self.explained |= {"content", *culprits} if culprits else set()
        if culprits:
            return
        if workers and diff.base_seed is not None:
            seeds = (self.a.batches[0].base_seed, self.b.batches[0].base_seed)
            source = (
                "the loader's generator"
                if loader.get("generator")
                else "torch's global stream (the loader has no generator=)"
            )
            evidence = (
                f"{what}; the {workers} loader workers are seeded from a base seed drawn from "
                f"{source}, which differs "
                f"({seeds[0]} vs {seeds[1]})"
            )
            self._add(
                Finding("unseeded-workers", "error", evidence, advice.data_fix(loader, order=False))
            )
            self.explained |= {
                "content",
                "torch",
                *(s for s in diff.streams if s in _LOADER_STREAMS),
            }
        else:
            self.unexplained.append(f"the contents of batch {batch}")

    def _hidden_streams(self) -> None:
        for name in self.diff.hidden:
            if name in self.explained:
                continue
            kind = self.a.built.hidden[name].kind
            seen = (
                f"the first {self.steps} batches came out the same"
                if self.diff.order is None
                else "the batches already hold other samples, so what it changes is not known"
            )
            evidence = f"{name} ({kind}) starts in a different state in each process; {seen}"
            workers = int(self.loader.get("num_workers") or 0)
            self._add(
                Finding(
                    f"unseeded-stream:{name}",
                    "warning",
                    evidence,
                    advice.generator_fix(name, kind, workers=workers),
                )
            )

    def _streams(self) -> None:
        """Unexplained streams: do the steps draw from them? Advance each by one draw and see."""
        final_differs = bool(self.diff.final) and self._started_alike()
        for name in self.diff.streams:
            if name in self.explained:
                continue
            digests = self._digests(name)
            changed = self.local.with_stream_advanced(name)
            if changed is not None:
                step, where = changed
                evidence = (
                    f"{name}'s stream is in a different state in each process after the build "
                    f"({digests}), and step {step} draws "
                    f"from it: with it one draw further, {where} changes (the step repeats without "
                    "it)"
                )
                self._add(
                    Finding(f"unseeded-stream:{name}", "error", evidence, advice.stream_fix([name]))
                )
                self.explained |= {"step", name}
            elif final_differs and self.local.unrepeatable_step is None:
                evidence = (
                    f"{name}'s stream is in a different state in each process after the build "
                    f"({digests}), and after "
                    f"{self.steps} steps the processes differ ({self.diff.final[0]} first) though "
                    "they started alike"
                )
                self._add(
                    Finding(f"unseeded-stream:{name}", "error", evidence, advice.stream_fix([name]))
                )
                self.explained |= {"step", name}
            else:
                evidence = (
                    f"{name}'s stream is in a different state in each process after the build "
                    f"({digests}); none of the first "
                    f"{self.steps} step(s) computes anything else with it one draw further, so "
                    "nothing here draws from it yet, but "
                    "anything that draws from it later will differ"
                )
                self._add(
                    Finding(f"unseeded-stream:{name}", "info", evidence, advice.stream_fix([name]))
                )
        if self.local.unrepeatable_step is not None:
            self.explained.add("step")


def _same(a: Probe, b: Probe) -> bool:
    return differences(a, b).none


def _hash_seed_findings(
    unexplained: list[str], pair: tuple[Probe, ...], again: tuple[Probe, ...]
) -> list[Finding]:
    """Two more processes, with the first two's PYTHONHASHSEED values, settle what no stream
    explained: each matches its namesake only if string hashing is the cause (a nondeterministic
    kernel or other entropy would have to repeat both outcomes by chance)."""
    what = ", ".join(unexplained)
    seeds = " vs ".join(_HASH_SEEDS)
    if all(_same(x, y) for x, y in zip(pair, again, strict=True)):
        unset = os.environ.get("PYTHONHASHSEED") in (None, "random")
        evidence = (
            f"{what} differ between two processes whose only difference is PYTHONHASHSEED "
            f"({seeds}), and two more processes "
            "with the same two values reproduce each: the recipe depends on string hashing "
            "(iteration order of a set or a "
            "dict keyed by str, or hash())"
        )
        if not unset:
            evidence += (
                "; reproducible here only because "
                f"PYTHONHASHSEED={os.environ['PYTHONHASHSEED']} is set"
            )
        fix = (
            advice.environment_fix(["env.PYTHONHASHSEED"])
            + "; better, sort what the recipe iterates (sorted(set(...)))"
        )
        return [Finding("pythonhashseed", "error" if unset else "warning", evidence, fix)]
    evidence = (
        f"{what} differ between two processes, and again between processes with the same "
        "PYTHONHASHSEED, while every random "
        "stream bisect-repro can see matched: the recipe draws from entropy outside them, or runs "
        "a nondeterministic kernel "
        "that happened to agree with itself in this process"
    )
    fix = (
        "look for randomness created without a seed outside the loader (np.random.default_rng(), "
        "random.Random(), "
        "torch.Generator().seed()) and values from time or os.urandom; run doctor again with more "
        "--steps to catch a "
        "rarely nondeterministic kernel"
    )
    return [Finding("unseeded-source", "error", evidence, fix)]


def doctor(
    target: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    progress: Progress | None = None,
    command: list[str] | None = None,
    replica: ReplicaFactory | None = None,
) -> DoctorReport:
    """Audit a recipe, or a script by its ``command`` (``["python", "train.py", ...]``), or without
    either this environment; ``replica`` starts each process of the code (``None``: a real one,
    see :mod:`~bisect_repro.diagnose.doctor.subjects`)."""
    started = time.perf_counter()
    say = progress or (lambda stage: None)
    config = dict(config or {})
    notes: list[str] = []
    if command is not None:
        if config:
            raise BisectReproError(
                "doctor: --set is for a recipe; a script takes its own arguments after --"
            )
        subject = script_subject(command, replica)
        target = subject.name
        findings, fingerprint = _diagnose(subject, _checked_steps(steps), say, notes)
    elif target is None:
        if config:
            raise BisectReproError("doctor: --set needs a TARGET to pass the settings to")
        fingerprint = env.fingerprint()
        pinned = fingerprint.get("env.OMP_NUM_THREADS") is not None
        findings = environment_findings(fingerprint, threads_pinned=pinned, audit=True)
    else:
        path = recipe_file(target)  # checks the TARGET's form
        if path is not None and not path.is_file():
            raise RecipeError(f"{path}: no such recipe file; check the TARGET path")
        subject = (
            recipe_subject(target, config)
            if replica is None
            else recipe_subject(target, config, replica)
        )
        findings, fingerprint = _diagnose(subject, _checked_steps(steps), say, notes)
    order = {severity: rank for rank, severity in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return DoctorReport(
        findings=findings,
        target=target,
        config=config,
        steps=steps if target is not None else None,
        seconds=round(time.perf_counter() - started, 3),
        environment=fingerprint,
        notes=notes,
    )


def _checked_steps(steps: int) -> int:
    if steps < 1:
        raise BisectReproError(f"--steps {steps}: must be at least 1")
    return steps


def _probes(subject: Subject, steps: int) -> tuple[Probe, ...]:
    """Two more processes, trained and read, then closed."""
    replicas = [subject.start(seed) for seed in _HASH_SEEDS]
    try:
        for replica in replicas:
            replica.connect()
        return tuple(probe(replica, steps)[0] for replica in replicas)
    finally:
        for replica in replicas:
            replica.close()


def _diagnose(
    subject: Subject, steps: int, say: Progress, notes: list[str]
) -> tuple[list[Finding], dict[str, Any]]:
    say("building the recipe in two processes")
    first, second = (subject.start(seed) for seed in _HASH_SEEDS)
    try:
        first.connect()
        second.connect()
        say(f"running the first {steps} step(s) in both")
        a, outcomes = probe(first, steps, keep=True)
        b, _ = probe(second, steps)
        second.close()
        # a script: its steps run again in processes whose global streams start alike
        if subject.pinned is not None:
            first.close()
            first = subject.pinned()
            first.connect()
            outcomes = probe(first, steps, keep=True)[1]
        fresh = subject.pinned or (lambda: subject.start(_HASH_SEEDS[0]))
        local = RecipeChecks(first, outcomes, a.built.environment, fresh=fresh)
        say(f"re-running the first {steps} step(s) from the same states")
        # first: nothing else may have run in between (a compiled step would recompile)
        not_checked = "its findings are missing"
        run_stage("re-run", notes, local.rerun_steps, None, not_checked)
        say("running step 0 under deterministic algorithms")
        run_stage("deterministic algorithms", notes, local.determinism_alerts, None, not_checked)
        say("comparing the processes")
        diagnosis = _Diagnosis(a, b, local, steps)
        none: list[Finding] = []
        findings = [*run_stage("comparison", notes, diagnosis.run, none, not_checked)]
        findings += local.findings
        if diagnosis.unexplained:
            say("two more processes, to tell string hashing from other entropy")
            findings += run_stage(
                "string hashing",
                notes,
                lambda: _hash_seed_findings(diagnosis.unexplained, (a, b), _probes(subject, steps)),
                none,
                not_checked,
            )
        fingerprint = a.built.environment
        pinned = fingerprint.get("env.OMP_NUM_THREADS") is not None or bool(a.built.threads_set)
        findings += environment_findings(
            fingerprint, threads_pinned=pinned, audit=False, convolutions=a.built.convolutions
        )
        threads_finding(findings, local)
        return findings, fingerprint
    finally:
        first.close()
        second.close()
