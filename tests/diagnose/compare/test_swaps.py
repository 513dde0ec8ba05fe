"""Run B's divergent step again under run A's conditions, one kind at a time, on fake replicas."""

from __future__ import annotations

from pathlib import Path

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.draft import Draft
from bisect_repro.diagnose.compare.records import Records, read_records
from bisect_repro.diagnose.compare.swaps import Swaps
from bisect_repro.diagnose.compare.verdict import Confidence, Evidence
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.replica import ReplicaFailed
from bisect_repro.serve.protocol import StepResult
from bisect_repro.store.meta import CodeKind
from tests.fake_programs import one_layer, record, reseeding, shuffled
from tests.fake_replica import FakeReplica, Launcher, Program

SCRIPTS = (
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/a.py"),
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/b.py"),
)


def replicas(
    a: Program, b: Program, specs: tuple[LaunchSpec, LaunchSpec] = SCRIPTS
) -> tuple[FakeReplica, FakeReplica]:
    """Both runs built and standing at step 0, its start kept."""
    pair = FakeReplica(a, "run A", specs[0]), FakeReplica(b, "run B", specs[1])
    for replica in pair:
        replica.connect()
        replica.fetch()
    return pair


def records_of(
    tmp_path: Path, a: Program, b: Program, specs: tuple[LaunchSpec, LaunchSpec] = SCRIPTS
) -> Records:
    return read_records(
        record(a, tmp_path / "a", steps=2, spec=specs[0]),
        record(b, tmp_path / "b", steps=2, spec=specs[1]),
    )


def swapped(
    records: Records, pair: tuple[FakeReplica, FakeReplica], launcher: Launcher | None = None
) -> Swaps:
    return Swaps(records, pair, SCRIPTS, 0, 0, [], start=launcher or Launcher({}))


def test_a_step_matches_under_run_as_streams_and_an_unused_stream_is_not_swapped(
    tmp_path: Path,
) -> None:
    # the step draws its dropout from torch only
    a = Program(step=one_layer, streams={"python": 7, "torch": 1})
    b = Program(step=one_layer, streams={"python": 8, "torch": 2})
    ra, rb = replicas(a, b)
    trace_a, trace_b = ra.run(0, trace="full"), rb.run(0, trace="full")
    assert trace_a.entries != trace_b.entries
    swaps, verdict = swapped(records_of(tmp_path, a, b), (ra, rb)), Draft(step=0)
    swaps.compute(verdict, trace_a)
    assert (verdict.cause, verdict.confidence, verdict.rng) == (
        Cause.RNG_STATE,
        Confidence.PROVEN,
        ["torch"],
    )
    # python differs too, but nothing drew from it in the records: never swapped
    assert swaps.evidence == [
        Evidence(
            experiment="stream",
            subject="run B with run A's random streams",
            outcome="matches",
            detail="with torch as in run A: step 0 of run B matches run A",
        ),
    ]
    # the swapped streams were for those runs only
    assert rb.run(0, trace="full").entries == trace_b.entries


def test_a_step_that_matches_under_run_as_in_process_settings_names_the_setting(
    tmp_path: Path,
) -> None:
    def threaded(call):  # a reduction whose order follows the thread count
        return one_layer(call, forward=call.environment.get("torch.get_num_threads"))

    a = Program(step=threaded, environment={"torch.get_num_threads": 1})
    b = Program(step=threaded, environment={"torch.get_num_threads": 4})
    ra, rb = replicas(a, b)
    swaps, verdict = swapped(records_of(tmp_path, a, b), (ra, rb)), Draft(step=0)
    swaps.compute(verdict, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence, verdict.environment_keys) == (
        Cause.ENVIRONMENT,
        Confidence.PROVEN,
        ["torch.get_num_threads"],
    )
    assert [(e.experiment, e.outcome, e.detail) for e in swaps.evidence] == [
        ("environment", "matches", "with torch.get_num_threads=1: step 0 of run B matches run A")
    ]
    assert rb.run(0).outcome != ra.run(0).outcome  # the settings were for that run only


def test_a_config_that_makes_the_step_match_is_proven_in_a_fresh_process_rebuilt_with_it(
    tmp_path: Path,
) -> None:
    recipe = Program(step=one_layer)  # the optimizer's update reads the config's lr
    specs = tuple(
        LaunchSpec(
            kind=CodeKind.RECIPE,
            target="/code/recipe.py:build",
            path="/code/recipe.py",
            config={"lr": lr},
        )
        for lr in (0.1, 0.2)
    )
    records = records_of(tmp_path, recipe, recipe, specs)
    assert records.differences.config == {"lr": [0.1, 0.2]}
    ra, rb = replicas(recipe, recipe, specs)
    launcher = Launcher({"/code/recipe.py": recipe})
    swaps, verdict = Swaps(records, (ra, rb), specs, 0, 0, [], start=launcher), Draft(step=0)
    swaps.compute(verdict, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence, verdict.config_keys) == (
        Cause.CONFIG,
        Confidence.PROVEN,
        ["lr"],
    )
    assert swaps.evidence == [
        Evidence(
            experiment="config",
            subject="run B rebuilt with run A's config",
            outcome="matches",
            detail="run B rebuilt with lr=0.1: step 0 of run B matches run A",
        )
    ]
    [fresh] = launcher.started
    assert (fresh.label, fresh.spec.config, fresh.closed) == (
        "run B rebuilt with run A's lr",
        {"lr": 0.1},
        True,
    )


def test_a_step_no_condition_explains_is_unexplained(tmp_path: Path) -> None:
    a, b = Program(step=one_layer), Program(step=lambda call: one_layer(call, forward="B's own"))
    ra, rb = replicas(a, b)
    swaps, verdict = swapped(records_of(tmp_path, a, b), (ra, rb)), Draft(step=0)
    swaps.compute(verdict, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence, swaps.evidence) == (
        Cause.UNKNOWN,
        Confidence.UNEXPLAINED,
        [],
    )


def test_a_batch_of_other_samples_matches_under_run_as_loader_stream(tmp_path: Path) -> None:
    a = Program(
        step=one_layer,
        loader=shuffled("loader.generator"),
        streams={"loader.generator": 3, "torch": 0},
    )
    b = Program(
        step=one_layer,
        loader=shuffled("loader.generator"),
        streams={"loader.generator": 4, "torch": 1},
    )
    ra, rb = (FakeReplica(p, label) for p, label in ((a, "run A"), (b, "run B")))
    ra.connect(), rb.connect()
    fetched_a, fetched_b = ra.fetch(), rb.fetch()
    assert fetched_a.order != fetched_b.order
    swaps, verdict = swapped(records_of(tmp_path, a, b), (ra, rb)), Draft(step=0)
    swaps.data(verdict, True, fetched_a, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence, verdict.rng) == (
        Cause.DATA_ORDER,
        Confidence.PROVEN,
        ["loader.generator"],
    )
    assert swaps.evidence == [
        Evidence(
            experiment="data_streams",
            subject="run B with run A's loader and global streams",
            outcome="matches",
            detail="with loader.generator, torch as in run A: step 0 of run B matches run A",
        ),
        Evidence(
            experiment="data_streams",
            narrowed_to="loader.generator",
            subject="run B with run A's loader.generator",
            outcome="matches",
            detail="loader.generator alone makes step 0 match",
        ),
    ]
    # fetching again put run B's loader back where it was
    assert rb.fetch().order != ra.fetch().order


def test_a_batch_that_differs_in_a_frameworks_loop_names_the_streams_that_differ_from_the_records(
    tmp_path: Path,
) -> None:
    a = Program(
        step=one_layer, loader=shuffled("torch"), streams={"torch": 1, "python": 1}, reruns=False
    )
    b = Program(
        step=one_layer, loader=shuffled("torch"), streams={"torch": 2, "python": 1}, reruns=False
    )
    records = records_of(tmp_path, a, b)
    ra, rb = (FakeReplica(p, label) for p, label in ((a, "run A"), (b, "run B")))
    for replica, run in zip((ra, rb), (records.a, records.b), strict=True):
        replica.connect()
        replica.restore(run.path, 0)
    fetched_a = ra.fetch()
    # a framework's loop tells the batch only as the step runs
    assert (fetched_a.order, fetched_a.batch) == (None, None)
    swaps, verdict = swapped(records, (ra, rb)), Draft(step=0)
    # same arguments: run A's trace is not asked for
    swaps.data(verdict, False, fetched_a, StepResult(step=0))
    assert (verdict.cause, verdict.confidence, verdict.rng) == (
        Cause.DATA_ORDER,
        Confidence.INFERRED,
        ["torch"],
    )
    assert swaps.evidence == [
        Evidence(
            experiment="data_streams",
            subject="run B's batch under run A's streams",
            outcome="inconclusive",
            detail="a script's or framework's loader cannot fetch a batch again; "
            "the streams a loader shuffles and seeds its workers from differ at the step's start: "
            "torch",
        ),
        # the whole step under run A's streams: the loader drew its order before the step began
        Evidence(
            experiment="stream",
            subject="run B with run A's random streams",
            outcome="differs",
            detail="with torch as in run A: step 0 of run B still differs",
        ),
    ]


def _script_specs() -> tuple[LaunchSpec, LaunchSpec]:
    return tuple(  # type: ignore[return-value]
        LaunchSpec(
            kind=CodeKind.SCRIPT,
            path="/code/train.py",
            argv=["train.py", "--lr", lr, "--token", "abc"],
            config={"--lr": float(lr)},
        )
        for lr in ("0.1", "0.2")
    )


def _by_flag(call):  # the script's update reads its --lr flag
    return one_layer(call, lr=call.spec.argv[2] if call.spec else None)


def test_a_script_flag_is_proven_by_relaunching_run_b_with_run_as_arguments(tmp_path: Path) -> None:
    script, specs = Program(step=_by_flag), _script_specs()
    records = records_of(tmp_path, script, script, specs)
    assert records.differences.config == {"--lr": [0.1, 0.2]}
    ra, rb = replicas(script, script, specs)
    launcher = Launcher({"/code/train.py": script})
    swaps, verdict = Swaps(records, (ra, rb), specs, 0, 0, [], start=launcher), Draft(step=0)
    swaps.compute(verdict, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence, verdict.config_keys) == (
        Cause.CONFIG,
        Confidence.PROVEN,
        ["--lr"],
    )
    assert [(e.experiment, e.subject, e.outcome, e.detail) for e in swaps.evidence] == [
        (
            "config",
            "run B relaunched with run A's arguments",
            "matches",
            "run B's script run with run A's command line (--lr 0.1 --token REDACTED): step 0 "
            "matches run A",
        )
    ]
    [fresh] = launcher.started
    assert fresh.spec.argv == specs[0].argv and fresh.closed


def test_a_script_that_does_not_take_run_as_arguments_leaves_the_config_experiment_inconclusive(
    tmp_path: Path,
) -> None:
    script, specs = Program(step=_by_flag), _script_specs()

    def refusing(spec: LaunchSpec, label: str) -> FakeReplica:
        raise ReplicaFailed(
            "run B relaunched with run A's arguments exited: error: unrecognized arguments: --lr"
        )

    ra, rb = replicas(script, script, specs)
    swaps, verdict = (
        Swaps(
            records_of(tmp_path, script, script, specs), (ra, rb), specs, 0, 0, [], start=refusing
        ),
        Draft(step=0),
    )
    swaps.compute(verdict, ra.run(0, trace="full"))
    assert (verdict.cause, verdict.confidence) == (Cause.UNKNOWN, Confidence.UNEXPLAINED)
    [tried] = swaps.evidence
    assert (
        tried.outcome == "inconclusive"
        and "did not reach step 0" in tried.detail
        and "unrecognized arguments" in tried.detail
    )


# -- a script's arguments and streams drawn before its first step, for a batch that differs
# -----------


def _flagged(*flags: str) -> tuple[LaunchSpec, LaunchSpec]:
    """One script run with ``flags[0] 1`` and ``flags[0] 2`` (each flag in ``flags`` given both
    values)."""
    return tuple(  # type: ignore[return-value]
        LaunchSpec(
            kind=CodeKind.SCRIPT,
            path="/code/train.py",
            argv=["train.py", *(w for f in flags for w in (f, v))],
            config={f: int(v) for f in flags},
        )
        for v in ("1", "2")
    )


def _reads_its_arguments(call):  # what the script's step computes follows its command line
    return one_layer(call, forward=call.spec.argv if call.spec else None)


def _script_loop(step) -> Program:
    return Program(step=step, loader=shuffled("torch"), streams={"torch": 1}, reruns=False)


def _data_swapped(
    tmp_path: Path, script: Program, specs: tuple[LaunchSpec, LaunchSpec]
) -> tuple[Swaps, Draft, Launcher]:
    records = records_of(tmp_path, script, script, specs)
    ra, rb = (
        FakeReplica(script, label, spec)
        for label, spec in zip(("run A", "run B"), specs, strict=True)
    )
    for replica, run in zip((ra, rb), (records.a, records.b), strict=True):
        replica.connect()
        replica.restore(run.path, 0)
    fetched_a, trace_a = ra.fetch(), ra.run(0, trace="full")
    launcher = Launcher({"/code/train.py": script})
    swaps, verdict = (
        Swaps(records, (ra, rb), specs, 0, 0, [], start=launcher),
        Draft(step=0, phase="data"),
    )
    swaps.data(verdict, False, fetched_a, trace_a)
    return swaps, verdict, launcher


def test_a_script_batch_that_its_arguments_decide_is_proven_config_by_relaunching_run_b_with_run_as(
    tmp_path: Path,
) -> None:
    swaps, verdict, launcher = _data_swapped(
        tmp_path, _script_loop(_reads_its_arguments), _flagged("--split-seed")
    )
    assert (verdict.cause, verdict.confidence, verdict.config_keys, verdict.rng) == (
        Cause.CONFIG,
        Confidence.PROVEN,
        ["--split-seed"],
        [],
    )
    assert (swaps.evidence[-1].experiment, swaps.evidence[-1].outcome) == ("config", "matches")
    [fresh] = launcher.started
    assert fresh.spec.argv == ["train.py", "--split-seed", "1"] and fresh.closed


def test_a_script_batch_with_only_its_worker_count_differing_is_not_put_on_the_argument(
    tmp_path: Path,
) -> None:
    swaps, verdict, launcher = _data_swapped(
        tmp_path, _script_loop(_reads_its_arguments), _flagged("--workers")
    )
    # the batch stays the data's
    assert (
        verdict.cause is Cause.DATA_ORDER and verdict.config_keys == [] and launcher.started == []
    )
    assert (swaps.evidence[-1].experiment, swaps.evidence[-1].outcome) == ("config", "inconclusive")
    assert "only the parallelism differs (--workers)" in swaps.evidence[-1].detail


# a split drawn from numpy before the loop: seeded only where the replay seeds it
def _drawn_before_the_first_step(call):
    seeds = (call.spec.seeds if call.spec else None) or {}
    return one_layer(call, forward=seeds.get("numpy", call.entropy))


def _numpy_split(
    tmp_path: Path, step, specs: tuple[LaunchSpec, LaunchSpec]
) -> tuple[Swaps, Draft, Launcher]:
    # numpy differs at the first snapshot
    a, b = (Program(step=step, streams={"numpy": n, "torch": 0}) for n in (5, 6))
    records = records_of(tmp_path, a, b, specs)
    assert records.timeline[0].streams == ["numpy"]
    launcher = Launcher({"/code/train.py": a})
    swaps = Swaps(records, replicas(a, b, specs), specs, 0, 0, [], start=launcher)
    verdict = Draft(step=0, phase="data", cause=Cause.DATA_CONTENT, confidence=Confidence.PROVEN)
    swaps.seeded_alike(verdict)
    return swaps, verdict, launcher


def test_a_script_whose_data_an_unseeded_global_stream_decides_is_proven_rng_state(
    tmp_path: Path,
) -> None:
    same = tuple(
        LaunchSpec(kind=CodeKind.SCRIPT, path="/code/train.py", argv=["train.py"]) for _ in "AB"
    )
    swaps, verdict, launcher = _numpy_split(tmp_path, _drawn_before_the_first_step, same)  # type: ignore[arg-type]
    assert (verdict.cause, verdict.confidence, verdict.rng) == (
        Cause.RNG_STATE,
        Confidence.PROVEN,
        ["numpy"],
    )
    assert [(e.experiment, e.outcome) for e in swaps.evidence] == [("data_streams", "matches")]
    assert [r.spec.seeds for r in launcher.started] == [{"numpy": 1234}] * 2 and all(
        r.closed for r in launcher.started
    )
    # the restore leaves the seeded stream as seeded, not as the checkpoint holds it
    assert [r.seeded for r in launcher.started] == [("numpy",)] * 2


def test_data_that_no_global_stream_decides_stays_the_datas_and_a_recipe_is_not_relaunched(
    tmp_path: Path,
) -> None:
    same = tuple(
        LaunchSpec(kind=CodeKind.SCRIPT, path="/code/train.py", argv=["train.py"]) for _ in "AB"
    )
    swaps, verdict, _ = _numpy_split(
        tmp_path, lambda call: one_layer(call, forward=call.entropy), same
    )  # type: ignore[arg-type]
    assert (verdict.cause, verdict.rng) == (Cause.DATA_CONTENT, []) and swaps.evidence[
        0
    ].outcome == "differs"
    recipes = tuple(
        LaunchSpec(kind=CodeKind.RECIPE, target="/code/train.py:build", path="/code/train.py")
        for _ in "AB"
    )
    swaps, verdict, launcher = _numpy_split(
        tmp_path / "recipe", _drawn_before_the_first_step, recipes
    )  # type: ignore[arg-type]
    assert verdict.cause is Cause.DATA_CONTENT and swaps.evidence == [] and launcher.started == []


def _unrepeated(
    tmp_path: Path, specs: tuple[LaunchSpec, LaunchSpec]
) -> tuple[bool, Draft, Launcher]:
    """Run B's step, which does not repeat itself (inferred ``rng_state``), put on the arguments."""
    script = _script_loop(_reads_its_arguments)
    records = records_of(tmp_path, script, script, specs)
    ra, rb = (FakeReplica(script, f"run {x}", spec) for x, spec in zip("AB", specs, strict=True))
    for replica, run in zip((ra, rb), (records.a, records.b), strict=True):
        replica.connect()
        replica.restore(run.path, 0)
    ra.fetch()
    trace_a = ra.run(0, trace="full")
    launcher = Launcher({"/code/train.py": script})
    verdict = Draft(
        step=0, phase="data", cause=Cause.RNG_STATE, confidence=Confidence.INFERRED, rng=["torch"]
    )
    swaps = Swaps(records, (ra, rb), specs, 0, 0, [], start=launcher)
    return swaps.unrepeated_by_arguments(verdict, trace_a), verdict, launcher


def test_a_run_that_does_not_repeat_itself_is_put_on_its_differing_arguments(
    tmp_path: Path,
) -> None:
    found, verdict, launcher = _unrepeated(tmp_path, _flagged("--env-seed"))
    assert found and (verdict.cause, verdict.confidence, verdict.config_keys, verdict.rng) == (
        Cause.CONFIG,
        Confidence.PROVEN,
        ["--env-seed"],
        [],
    )
    [relaunched] = launcher.started
    assert relaunched.spec.argv == ["train.py", "--env-seed", "1"] and relaunched.closed


def test_a_run_that_does_not_repeat_itself_is_not_put_on_its_worker_count(tmp_path: Path) -> None:
    found, verdict, launcher = _unrepeated(tmp_path, _flagged("--workers"))
    assert not found and verdict.cause is Cause.RNG_STATE and launcher.started == []


def test_an_unexplained_batch_after_a_reseed_the_step_logs_show_is_that_stream_inferred(
    tmp_path: Path,
) -> None:
    plain = Program(step=one_layer, streams={"torch": 1}, reruns=False)
    reseeded = Program(step=reseeding, streams={"torch": 1}, reruns=False)
    for records, named in (
        (records_of(tmp_path / "reseeded", plain, reseeded), True),
        (records_of(tmp_path / "plain", plain, plain), False),
    ):
        verdict = Draft(
            step=1, phase="data", cause=Cause.DATA_ORDER, confidence=Confidence.UNEXPLAINED
        )
        no_replicas = (None, None)  # the records alone decide it
        swaps = Swaps(records, no_replicas, SCRIPTS, 1, 0, [], start=Launcher({}))  # type: ignore[arg-type]
        swaps._reseeded_before_data(verdict)
        if named:
            assert (verdict.cause, verdict.confidence, verdict.rng) == (
                Cause.RNG_STATE,
                Confidence.INFERRED,
                ["torch"],
            )
            assert [call.where for call in verdict.reseeded] == ["train.py:12"] * len(
                verdict.reseeded
            ) and verdict.reseeded
        else:
            assert (verdict.cause, verdict.confidence) == (Cause.DATA_ORDER, Confidence.UNEXPLAINED)
