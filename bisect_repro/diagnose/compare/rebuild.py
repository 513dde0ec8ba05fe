"""Which random streams decide a model's initial state, proven by building it again.

When two runs differ before their first step, the code is run again, up to the point where its
Recorder is built, in fresh processes whose global streams (Python, NumPy, torch) are seeded
before anything runs: twice with every stream fixed (the initial state must repeat), and once
per stream with that stream alone seeded differently (the streams whose change changes the
initial state decide it). Run B's code is built once with the same fixed streams too: if it then
equals run A's, the two runs differ only in how their streams were seeded. Where their settings
differ, run B's code is built once more with the same fixed streams and run A's settings (a
script's command line, a recipe's config): if that equals run A's, the settings decide it. All
the processes run at once.

Where the guarantees stop: only the global streams are varied; a model initialised from a
generator of its own, or from entropy (``torch.seed()``, ``os.urandom``), does not repeat with
every global stream fixed, and the seeding calls seen during the build are named instead.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ...capture.rng import GLOBAL_STREAMS
from ...capture.seeding import SeedingCall
from ...replay.interface import ReplicaFactory
from ...replay.launch import LaunchSpec
from ...replay.ranked import start_replica
from ...replay.replica import ReplicaFailed
from ...store.meta import CodeKind
from .causes import Cause
from .verdict import Confidence, Evidence

__all__ = ["InitStreams", "streams_deciding_init"]

_BASE = 1234


@dataclass(frozen=True, kw_only=True)
class InitStreams:
    """What building the code again showed about the random streams that decide its initial
    state."""

    cause: Cause
    """``rng_state`` when the streams are shown to decide it, else ``unknown``."""
    confidence: Confidence
    streams: list[str]
    """The streams whose change changes the initial state (those reseeded, when it does not
    repeat)."""
    reseeds: list[SeedingCall]
    """The seeding calls from entropy seen during the build, when the initial state does not
    repeat."""
    evidence: list[Evidence]
    settings_decide: bool = False
    """Run B's code built with run A's settings (and the same fixed streams) gives run A's initial
    state."""


_SETTINGS = "b with a's settings"  # the one build that may fail


@dataclass(frozen=True)
class _Built:
    """One build: the hash of each tensor after it, and the seeding calls it made."""

    hashes: dict[str, str]
    seeding: list[SeedingCall]


def _built(start: ReplicaFactory, spec: LaunchSpec, label: str) -> _Built:
    """One build's initial state."""
    with start(spec, label) as replica:
        replica.connect()
        description = replica.describe()
    return _Built(
        dict(description.init), [SeedingCall.from_json(c) for c in description.build_seeding]
    )


def _built_if_it_can(start: ReplicaFactory, spec: LaunchSpec, label: str) -> _Built | None:
    """One build's initial state, ``None`` where it fails (as run B's script may with run A's
    arguments)."""
    try:
        return _built(start, spec, label)
    except ReplicaFailed:
        return None


def _with_settings_of(a: LaunchSpec, b: LaunchSpec) -> LaunchSpec | None:
    """Run B's code with run A's settings: a script's command line, a recipe's config (``None``:
    they are the same)."""
    if b.kind is CodeKind.RECIPE:
        return None if a.config == b.config else b.with_config(a.config)
    return None if list(a.argv) == list(b.argv) else replace(b, argv=list(a.argv))


def _differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [name for name in dict.fromkeys([*a, *b]) if a.get(name) != b.get(name)]


def _one_stream(name: str, changed: list[str], seeding: list[SeedingCall]) -> Evidence:
    """What seeding ``name`` differently before the code ran showed; where the code seeds that
    stream itself, it overrides the experiment's seed, which then shows nothing either way."""
    subject = f"run A's code with only {name} seeded differently"
    if changed:
        return Evidence(
            experiment="stream",
            narrowed_to=name,
            subject=subject,
            outcome="differs",
            detail=f"{changed[0]} changes",
        )
    own = [c for c in seeding if c.stream == name and c.call]
    if own:
        detail = (
            f"the code seeds {name} itself ({own[0].describe()}), which overrides the seed given "
            "before it ran: "
            "this cannot show whether the build draws from it"
        )
        return Evidence(
            experiment="stream",
            narrowed_to=name,
            subject=subject,
            outcome="inconclusive",
            detail=detail,
        )
    return Evidence(
        experiment="stream",
        narrowed_to=name,
        subject=subject,
        outcome="matches",
        detail="the initial state is the same: nothing in the build draws from it",
    )


def streams_deciding_init(
    specs: tuple[LaunchSpec, LaunchSpec], start: ReplicaFactory = start_replica
) -> InitStreams:
    """What decides the initial state of two runs that differ at their first snapshot; ``start``
    starts each build (a real process by default)."""
    spec_a, spec_b = specs
    fixed = dict.fromkeys(GLOBAL_STREAMS, _BASE)
    jobs: dict[str, LaunchSpec] = {
        "control": spec_a.with_seeds(fixed),
        "again": spec_a.with_seeds(fixed),
        "b": spec_b.with_seeds(fixed),
    }
    for name in GLOBAL_STREAMS:
        jobs[name] = spec_a.with_seeds({**fixed, name: _BASE + 1})
    settings = _with_settings_of(spec_a, spec_b)
    if settings is not None:
        jobs[_SETTINGS] = settings.with_seeds(fixed)
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            key: pool.submit(
                _built_if_it_can if key == _SETTINGS else _built,
                start,
                spec,
                f"run {'B' if key.startswith('b') else 'A'} built with fixed streams",
            )
            for key, spec in jobs.items()
        }
        found = {key: future.result() for key, future in futures.items()}
    built = {key: value for key, value in found.items() if value is not None}
    evidence: list[Evidence] = []
    control = built["control"].hashes
    decided = _settings_decide(control, settings, found.get(_SETTINGS), evidence)
    repeats = not _differing(control, built["again"].hashes)
    fixed_text = ", ".join(GLOBAL_STREAMS)
    evidence.append(
        Evidence(
            experiment="rebuild",
            subject="run A's code, twice, with " + fixed_text + " seeded alike",
            outcome="matches" if repeats else "differs",
            detail="the initial state repeats"
            if repeats
            else "the initial state still differs "
            f"({_differing(control, built['again'].hashes)[0]} first)",
        )
    )
    if not repeats:
        reseeds = [c for c in built["control"].seeding if c.entropy]
        cause, confidence = (
            (Cause.RNG_STATE, Confidence.PROVEN)
            if reseeds
            else (Cause.UNKNOWN, Confidence.UNEXPLAINED)
        )
        return InitStreams(
            cause=cause,
            confidence=confidence,
            streams=sorted({c.stream for c in reseeds}),
            reseeds=reseeds,
            evidence=evidence,
            settings_decide=decided,
        )
    deciding = []
    for name in GLOBAL_STREAMS:
        changed = _differing(control, built[name].hashes)
        evidence.append(_one_stream(name, changed, built[name].seeding))
        if changed:
            deciding.append(name)
    same_code = not _differing(control, built["b"].hashes)
    evidence.append(
        Evidence(
            experiment="rebuild",
            subject="run B's code with the same fixed streams",
            outcome="matches" if same_code else "differs",
            detail="it builds run A's initial state"
            if same_code
            else "it still builds another initial state",
        )
    )
    cause, confidence = (
        (Cause.RNG_STATE, Confidence.PROVEN)
        if deciding and same_code
        else (Cause.UNKNOWN, Confidence.UNEXPLAINED)
    )
    return InitStreams(
        cause=cause,
        confidence=confidence,
        streams=deciding,
        reseeds=[],
        evidence=evidence,
        settings_decide=decided,
    )


def _settings_decide(
    control: dict[str, str],
    settings: LaunchSpec | None,
    built: _Built | None,
    evidence: list[Evidence],
) -> bool:
    """Whether run B's code built with run A's settings gives run A's initial state; the evidence
    says so (nothing where the settings are the same)."""
    if settings is None:
        return False
    subject = "run B's code with run A's settings and the same fixed streams"
    if built is None:
        evidence.append(
            Evidence(
                experiment="config",
                subject=subject,
                outcome="inconclusive",
                detail="run B's code did not build with run A's settings",
            )
        )
        return False
    differing = _differing(control, built.hashes)
    evidence.append(
        Evidence(
            experiment="config",
            subject=subject,
            outcome="differs" if differing else "matches",
            detail=f"the initial state still differs ({differing[0]} first)"
            if differing
            else "it builds run A's initial state: the settings decide it",
        )
    )
    return not differing
