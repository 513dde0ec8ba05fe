"""The experiments on a divergent step, from the lockstep to the verdict, on fake replicas recorded
from their programs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.experiments import StepAnalysis
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.verdict import Confidence, Evidence, Verdict
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.lockstep import Lockstep
from bisect_repro.store.meta import CodeKind
from tests.fake_programs import one_layer, only_at, record, reseeding
from tests.fake_replica import Call, Launcher, Outcome, Program

SPECS = (
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/a.py"),
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/b.py"),
)
RESEED = SeedingCall("torch", "torch.seed()", True, "train.py:12")


def explained(
    tmp_path: Path,
    a: Program,
    b: Program,
    checkpoints: tuple[int, ...] = (0, 4),
    here: tuple[Program, Program] | None = None,
) -> tuple[StepAnalysis, Verdict, Launcher]:
    """Both runs recorded for 8 steps (a snapshot every 2), replayed (by the programs ``here``, the
    recorded ones by default) from step 4 to the divergence, and explained."""
    runs = tuple(
        record(p, tmp_path / n, steps=8, every=2, checkpoints=checkpoints)
        for p, n in ((a, "a"), (b, "b"))
    )
    records = read_records(*runs)
    assert (records.last_equal, records.end) == (4, 5)
    launcher = Launcher(dict(zip(("/code/a.py", "/code/b.py"), here or (a, b), strict=True)))
    lockstep = Lockstep(runs, SPECS, start=launcher)
    first = (checkpoints[0], checkpoints[0])
    divergence = lockstep.find((4, 4), 4, records.end, first)
    assert divergence is not None and divergence.step == 5
    analysis = StepAnalysis(
        records,
        lockstep,
        divergence,
        SPECS,
        first if lockstep.from_step == first[0] else (4, 4),
        start=launcher,
    )
    return analysis, analysis.explain(), launcher


def test_a_step_that_reseeds_from_entropy_in_run_b_is_proven_by_fixing_the_entropy(
    tmp_path: Path,
) -> None:
    analysis, verdict, _ = explained(
        tmp_path, Program(step=one_layer), Program(step=only_at(5, reseeding))
    )
    assert (verdict.step, verdict.phase, verdict.layer, verdict.tensor) == (
        5,
        "forward",
        "fc",
        "fc.output",
    )
    assert (verdict.cause, verdict.confidence, verdict.rng, verdict.reseeded) == (
        Cause.RNG_STATE,
        Confidence.PROVEN,
        ["torch"],
        [RESEED],
    )
    assert [(e.experiment, e.subject, e.outcome) for e in verdict.evidence] == [
        ("replay", "runs A and B", "differs"),
        ("self_rerun", "run A", "matches"),
        ("self_rerun", "run B", "differs"),
        ("reseed_fixed", "run B", "matches"),
    ]
    assert verdict.evidence[0].detail == "replayed, step 5 first differs at fc.output (forward)"
    assert (
        verdict.evidence[2].detail
        == "step 5 run again from the same state ends with torch in a different state each time"
    )
    assert (
        verdict.evidence[3].detail
        == "with torch.seed() at train.py:12 given a fixed seed, step 5 repeats exactly"
    )
    # the op trace names the first op whose outputs part on equal inputs: the dropout mask, drawn
    # from the reseeded stream
    assert verdict.op == "aten.bernoulli_.float" and verdict.fraction_differing
    assert [
        (row.op, row.first, row.inputs_equal, row.outputs_equal) for row in analysis.ops_context
    ] == [
        ("aten.mm.default", False, True, True),
        ("aten.bernoulli_.float", True, True, False),
        ("aten.mul.Tensor", False, False, False),
    ]
    assert verdict.explanation == (
        "torch is reseeded from entropy during the step (torch.seed() at train.py:12), so step 5, "
        "forward pass, fc.output "
        "(op aten.bernoulli_.float) differs from run to run"
    )
    assert (
        verdict.fix
        == "remove the reseeding from entropy (torch.seed() at train.py:12), or give it a seed: "
        "torch.manual_seed(seed)"
    )


def test_a_stream_that_ends_each_run_in_another_state_without_an_entropy_call_is_only_inferred(
    tmp_path: Path,
) -> None:
    # torch.manual_seed(time.time_ns()): an explicit seed, never fixed
    def from_the_clock(call: Call) -> Outcome:
        seeded = SeedingCall("torch", "torch.manual_seed(...)", False, "train.py:30").to_json()
        return one_layer(call, streams={**call.streams, "torch": call.entropy}, seeding=[seeded])

    _, verdict, _ = explained(
        tmp_path, Program(step=one_layer), Program(step=only_at(5, from_the_clock))
    )
    assert (verdict.cause, verdict.confidence, verdict.rng, verdict.reseeded) == (
        Cause.RNG_STATE,
        Confidence.INFERRED,
        ["torch"],
        [],
    )
    assert verdict.evidence[-1] == Evidence(
        experiment="reseed_fixed",
        subject="run B",
        outcome="differs",
        detail="with every seeding from entropy given a fixed seed, step 5 still differs from "
        "itself",
        run="B",
    )
    assert "with run A's streams run B matches" not in verdict.explanation  # no stream was swapped
    assert verdict.explanation == (
        "torch ends the step in a different state each time the step runs from the same state: it "
        "is reseeded during the step "
        "from a value that changes, so step 5, forward pass, fc.output (op aten.bernoulli_.float) "
        "differs from run to run"
    )


def test_a_step_that_depends_on_how_often_the_code_ran_is_proven_in_fresh_processes(
    tmp_path: Path,
) -> None:
    # a counter in a closure
    warm = Program(step=lambda call: one_layer(call, forward="warm" if call.calls >= 5 else None))
    analysis, verdict, launcher = explained(
        tmp_path, warm, Program(step=one_layer), checkpoints=(4,)
    )
    # replayed from step 4, run A computes what run B does, not what it recorded
    assert analysis.divergence.parted_only
    assert (verdict.step, verdict.cause, verdict.confidence) == (
        5,
        Cause.HIDDEN_STATE,
        Confidence.PROVEN,
    )
    assert verdict.evidence[0] == Evidence(
        experiment="replay",
        subject="runs A and B",
        outcome="matches",
        detail="replayed, the runs agree at step 5 and each repeats it, but not what was recorded "
        "there",
    )
    assert verdict.evidence[-1] == Evidence(
        experiment="replay",
        subject="run A with its first step run 4 extra times",
        outcome="differs",
        detail="replayed again from step 4 with that step run 4 extra times first, step 5 computes "
        "something else: "
        "it depends on how often the code ran",
        run="A",
    )
    assert verdict.explanation.startswith(
        "step 5 does not compute what was recorded when replayed from a checkpoint"
    )
    # run A afresh: with the extra runs, then without them (the control)
    fresh = launcher.started[2:]
    assert [(r.label, r.spec, r.closed) for r in fresh] == [
        ("run A with its first step run 4 extra times", SPECS[0], True)
    ] * 2


def test_a_replay_agreeing_where_the_records_do_not_on_another_machine_blames_it_inferred(
    tmp_path: Path,
) -> None:
    def versioned(call: Call) -> Outcome:  # a kernel that changed between torch versions
        return one_layer(call, forward=call.environment["torch"] if call.step == 5 else None)

    def on(version: str) -> Program:
        return Program(step=versioned, environment={"torch": version, "cpu": "x86"})

    _, verdict, launcher = explained(
        tmp_path, on("2.5.0"), on("2.6.0"), checkpoints=(4,), here=(on("2.6.0"), on("2.6.0"))
    )
    assert (verdict.step, verdict.cause, verdict.confidence, verdict.environment_keys) == (
        5,
        Cause.ENVIRONMENT,
        Confidence.INFERRED,
        ["torch"],
    )
    assert verdict.explanation == (
        "the replay of step 5 does not reproduce the records, and this machine differs from the "
        "recording's "
        "(torch 2.5.0 recorded, 2.6.0 here)"
    )
    assert verdict.fix == "compare the runs where they were recorded, or record them again here"
    assert len(launcher.started) == 2  # no fresh process: a replay here cannot tell


def test_a_batch_differing_each_time_drawn_from_one_state_is_proven_from_an_unrecorded_stream(
    tmp_path: Path,
) -> None:
    import itertools

    from tests.fake_replica import Batch, digest, sequential

    draws = itertools.count(1)

    # an augmentation drawing from a generator no stream holds
    def unseeded(position: int, streams: Mapping[str, Any]) -> Batch:
        return (
            Batch([position], digest("noisy", position, next(draws)), streams)
            if position == 5
            else sequential(position, streams)
        )

    # scripts run unchanged
    a, b = (
        Program(step=one_layer, reruns=False),
        Program(step=one_layer, loader=unseeded, reruns=False),
    )
    runs = tuple(
        record(p, tmp_path / n, steps=8, every=2, checkpoints=(0,)) for p, n in ((a, "a"), (b, "b"))
    )
    records = read_records(*runs)
    launcher = Launcher(dict(zip(("/code/a.py", "/code/b.py"), (a, b), strict=True)))
    lockstep = Lockstep(runs, SPECS, start=launcher)
    # a framework's run replays from its start
    divergence = lockstep.find((0, 0), 4, records.end, (0, 0))
    assert divergence is not None and divergence.step == 5
    analysis = StepAnalysis(records, lockstep, divergence, SPECS, (0, 0), start=launcher)
    verdict = analysis.explain()
    assert (verdict.step, verdict.phase, verdict.cause, verdict.confidence) == (
        5,
        "data",
        Cause.DATA_CONTENT,
        Confidence.PROVEN,
    )
    assert analysis.unrecorded_data and verdict.evidence[-1] == Evidence(
        experiment="self_rerun",
        subject="run B",
        outcome="differs",
        detail="step 5 run again from the same state (every recorded stream restored) draws "
        "another batch.0: "
        "the data is drawn from a generator that no restored stream decides",
        run="B",
    )
    # run A's loader repeats itself
    assert [e.outcome for e in verdict.evidence if e.subject == "run A"] == ["matches"]
