"""The cause rules (diagnose/compare/rules.py) against fakes: each cause's precondition, the replay
checked against the records, the precedence of the records' verdict, and the property checker on
results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.differences import Differences
from bisect_repro.diagnose.compare.from_records import records_verdict
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.rules import (
    PRECEDENCE,
    RULES,
    arguments_not_named_for_data,
    reconcile,
    violation,
)
from bisect_repro.diagnose.compare.settings import SettingsDifference
from bisect_repro.diagnose.compare.signals import Signals
from bisect_repro.diagnose.compare.verdict import (
    CompareResult,
    Confidence,
    Evidence,
    Verdict,
)
from tests.diagnose.compare.test_records import run
from tests.rules_check import rule_violations

ORDER_EQUAL_BATCH_DIFFERS = Signals(order=None, batch=3)
ORDER_DIFFERS = Signals(order=3, batch=3)


def _rerun(outcome: str, subject: str = "run B") -> Evidence:
    run = subject.removeprefix("run ") if subject in ("run A", "run B") else None
    return Evidence(
        experiment="self_rerun", subject=subject, outcome=outcome, detail="step run again", run=run
    )


@pytest.mark.parametrize(
    ("verdict", "signals", "allowed"),
    [
        (Verdict(step=3, cause=Cause.DATA_ORDER), ORDER_DIFFERS, True),
        (Verdict(step=3, cause=Cause.DATA_ORDER), ORDER_EQUAL_BATCH_DIFFERS, False),
        # order unknown
        (
            Verdict(step=3, cause=Cause.DATA_ORDER, tensor="batch"),
            Signals(batch=3, order_recorded=False),
            False,
        ),
        # the order still matches at step 2
        (Verdict(step=2, cause=Cause.DATA_ORDER), ORDER_DIFFERS, False),
        (Verdict(step=3, cause=Cause.DATA_CONTENT), ORDER_EQUAL_BATCH_DIFFERS, True),
        (Verdict(step=3, cause=Cause.DATA_CONTENT), ORDER_DIFFERS, False),
        (
            Verdict(step=3, cause=Cause.DATA_CONTENT, evidence=[_rerun("differs")]),
            Signals(batch=3, order_recorded=False),
            True,
        ),
        (
            Verdict(step=3, cause=Cause.CONFIG, config_keys=["--gamma"]),
            Signals(config=("--gamma",)),
            True,
        ),
        (
            Verdict(step=3, cause=Cause.CONFIG, config_keys=["--lr"]),
            Signals(config=("--gamma",)),
            False,
        ),
        (Verdict(step=3, cause=Cause.CONFIG), Signals(), False),
        (Verdict(step=3, cause=Cause.RNG_STATE), Signals(streams=("torch",)), True),
        (Verdict(step=3, cause=Cause.RNG_STATE), Signals(reseeded=(3,)), True),
        # a reseed after the step
        (Verdict(step=3, cause=Cause.RNG_STATE), Signals(reseeded=(4,)), False),
        (Verdict(step=3, cause=Cause.RNG_STATE), Signals(), False),
        # drawn by the build, before step 0
        (Verdict(step=0, cause=Cause.RNG_STATE), Signals(at_start=(0, ("torch",))), True),
        # no stream differs there
        (Verdict(step=0, cause=Cause.RNG_STATE), Signals(at_start=(0, ())), False),
        # past the first snapshot
        (Verdict(step=3, cause=Cause.RNG_STATE), Signals(at_start=(0, ("torch",))), False),
        (
            Verdict(step=3, cause=Cause.ENVIRONMENT),
            Signals(environment=("torch.get_num_threads",)),
            True,
        ),
        (Verdict(step=3, cause=Cause.ENVIRONMENT), Signals(), False),
        (
            Verdict(step=3, cause=Cause.NONDETERMINISTIC_OP, evidence=[_rerun("differs")]),
            Signals(),
            True,
        ),
        (
            Verdict(step=3, cause=Cause.NONDETERMINISTIC_OP, evidence=[_rerun("matches")]),
            Signals(),
            False,
        ),
        (
            Verdict(
                step=3,
                cause=Cause.NONDETERMINISTIC_OP,
                evidence=[_rerun("differs", "runs A and B")],
            ),
            Signals(),
            False,
        ),
        (Verdict(step=3, cause=Cause.HIDDEN_STATE, evidence=[_rerun("differs")]), Signals(), True),
        (Verdict(step=3, cause=Cause.HIDDEN_STATE), Signals(config=("lr",)), False),
        (Verdict(step=0, cause=Cause.STRUCTURE), Signals(structure="fc.weight"), True),
        (Verdict(step=0, cause=Cause.STRUCTURE), Signals(), False),
        (Verdict(step=3, cause=Cause.UNKNOWN), Signals(), True),
    ],
)
def test_each_cause_is_named_only_where_its_precondition_holds(
    verdict: Verdict, signals: Signals, allowed: bool
) -> None:
    problem = violation(verdict, signals)
    assert (problem is None) is allowed, problem
    if problem is not None:
        assert problem.startswith(
            f"{verdict.cause.value} requires that {RULES[verdict.cause].requires}"
        )


def test_every_cause_has_one_rule_and_the_precedence_names_only_causes_with_rules() -> None:
    assert set(RULES) == set(Cause)
    assert all(cause in RULES for _, cause in PRECEDENCE)
    # the exact data signals come first
    assert [signal.name for signal, _ in PRECEDENCE][:2] == ["order", "batch"]


def _records_verdict() -> Verdict:
    return Verdict(
        step=3, phase="data", cause=Cause.DATA_CONTENT, explanation="from the records alone"
    )


def test_a_replay_naming_the_data_order_where_it_is_equal_yields_to_the_records() -> None:
    replayed = Verdict(
        step=3,
        phase="data",
        cause=Cause.DATA_ORDER,
        confidence=Confidence.PROVEN,
        evidence=[_rerun("matches")],
    )
    verdict, notes = reconcile(replayed, ORDER_EQUAL_BATCH_DIFFERS, _records_verdict())
    assert (verdict.cause, verdict.step, verdict.phase) == (Cause.DATA_CONTENT, 3, "data")
    assert verdict.evidence[0] == replayed.evidence[0]  # what the replay ran is kept
    assert (
        len(notes) == 1
        and "the replay named the data order (proven), but data_order requires that the sample "
        "order"
        in notes[0]
    )


def test_a_replay_placing_the_divergence_after_a_differing_batch_yields_to_the_records() -> None:
    replayed = Verdict(
        step=3,
        phase="forward",
        layer="fc3",
        cause=Cause.RNG_STATE,
        confidence=Confidence.PROVEN,
        reseeded=[{"call": "x"}],
    )
    verdict, notes = reconcile(
        replayed, Signals(order=3, batch=3, reseeded=(3,)), _records_verdict()
    )
    assert (
        verdict.phase == "data"
        and "the records show the batch of step 3 already differs" in notes[0]
    )
    # the step's second micro-batch, drawn after its first forward, differs
    micro_batches = Signals(batch=3, reseeded=(3,))
    assert reconcile(replayed, micro_batches, _records_verdict()) == (replayed, [])


def test_a_replay_that_satisfies_its_rule_is_reported_as_it_is() -> None:
    replayed = Verdict(
        step=5,
        phase="forward",
        cause=Cause.CONFIG,
        config_keys=["--gamma"],
        confidence=Confidence.PROVEN,
    )
    assert reconcile(replayed, Signals(config=("--gamma",), batch=9), _records_verdict()) == (
        replayed,
        [],
    )


def test_a_records_verdict_that_would_break_its_rule_too_becomes_unknown() -> None:
    replayed = Verdict(step=3, phase="data", cause=Cause.DATA_ORDER, confidence=Confidence.PROVEN)
    verdict, _ = reconcile(replayed, Signals(), Verdict(step=3, cause=Cause.CONFIG))
    assert (verdict.cause, verdict.confidence) == (Cause.UNKNOWN, Confidence.UNEXPLAINED)


def test_an_order_drawn_right_after_a_reseed_is_the_reseed_in_the_data_between_two_steps(
    tmp_path: Path,
) -> None:
    call = {"stream": "torch", "call": "torch.seed()", "entropy": True, "where": "vae.py:88"}
    a = run(tmp_path / "a")
    b = run(
        tmp_path / "b",
        hashes={4: "moved", 6: "moved"},
        orders={3: "other", 4: "other"},
        batches={3: "x"},
        seeded={3: call},
    )
    verdict = records_verdict(read_records(a, b))
    assert (verdict.step, verdict.phase, verdict.tensor, verdict.cause) == (
        3,
        "data",
        "batch.indices",
        Cause.RNG_STATE,
    )
    assert (
        verdict.reseeded == [SeedingCall.from_json(call)]
        and "between steps 2 and 3 (torch.seed() at vae.py:88)" in verdict.explanation
    )
    assert "remove the reseeding from entropy" in verdict.fix


def test_an_order_difference_with_no_reseed_stays_the_data_order(tmp_path: Path) -> None:
    a, b = (
        run(tmp_path / "a"),
        run(tmp_path / "b", hashes={4: "moved"}, orders={3: "other"}, batches={3: "x"}),
    )
    verdict = records_verdict(read_records(a, b))
    assert (verdict.step, verdict.cause, verdict.tensor) == (3, Cause.DATA_ORDER, "batch.indices")


def test_the_order_equal_and_the_batch_different_is_the_data_content_before_any_config(
    tmp_path: Path,
) -> None:
    a = run(tmp_path / "a", config={"--lr": 0.1})
    b = run(tmp_path / "b", hashes={4: "moved"}, batches={3: "edited"}, config={"--lr": 0.2})
    verdict = records_verdict(read_records(a, b))
    assert (verdict.step, verdict.cause) == (3, Cause.DATA_CONTENT)


def test_evidence_from_records_that_part_at_the_first_snapshot_never_says_none(
    tmp_path: Path,
) -> None:
    a, b = run(tmp_path / "a"), run(tmp_path / "b", hashes={0: "x", 2: "y", 4: "z", 6: "w"})
    verdict = records_verdict(read_records(a, b))
    text = " ".join([verdict.explanation, *(e.detail for e in verdict.evidence)])
    assert (
        "None" not in text and "the snapshots differ from the first one compared (step 0)" in text
    )


def test_the_property_checker_catches_a_verdict_that_violates_its_precondition() -> None:
    result = CompareResult(
        runs=["a", "b"], first_log_difference={"order": None, "batch": 8, "loss": 8}
    )
    result.verdict = Verdict(
        step=8,
        phase="data",
        tensor="batch.indices",
        cause=Cause.DATA_ORDER,
        confidence=Confidence.PROVEN,
    )
    assert rule_violations(result) == [violation(result.verdict, Signals(batch=8))]
    result.verdict = replace(result.verdict, cause=Cause.DATA_CONTENT)
    assert rule_violations(result) == []


def test_the_property_checker_reads_a_comparison_back_from_its_json() -> None:
    result = CompareResult(
        runs=["a", "b"],
        differences=Differences(config={"--gamma": [0.7, 0.5]}),
        first_log_difference={"loss": 4},
    )
    result.verdict = Verdict(step=4, cause=Cause.CONFIG, config_keys=["--gamma"], evidence=[])
    assert rule_violations(CompareResult.from_json(result.to_json())) == []
    result.differences = Differences()
    assert rule_violations(CompareResult.from_json(result.to_json()))[0].startswith(
        "config requires that a config value"
    )


def test_a_reseed_the_step_logs_show_counts_for_the_rng_rule_in_a_finished_comparison() -> None:
    result = CompareResult(runs=["a", "b"], first_log_difference={"loss": 3}, reseeded_steps=[2])
    result.verdict = Verdict(step=3, cause=Cause.RNG_STATE)
    assert rule_violations(result) == []
    assert rule_violations(CompareResult.from_json(result.to_json())) == []
    result.verdict = replace(result.verdict, step=1)  # before the reseed the logs show
    assert rule_violations(result) != []


def test_the_property_checker_catches_a_line_that_prints_none() -> None:
    result = CompareResult(runs=["a", "b"], first_log_difference={"loss": 4})
    result.verdict = Verdict(step=4, explanation="the snapshots are equal up to step None")
    assert rule_violations(result) == ["prints None: the snapshots are equal up to step None"]


def test_a_batch_without_recorded_indices_is_the_data_of_its_step_and_the_config_its_cause(
    tmp_path: Path,
) -> None:
    orders = dict.fromkeys(range(6))  # the GAN's discriminator input: no sample indices
    a = run(tmp_path / "a", orders=orders, config={"--lrG": None})
    b = run(
        tmp_path / "b",
        orders=orders,
        batches={1: "fake images"},
        hashes={2: "moved"},
        config={"--lrG": 0.0004},
    )
    verdict = records_verdict(read_records(a, b))
    where = (verdict.step, verdict.phase, verdict.tensor)
    assert (*where, verdict.cause, verdict.config_keys) == (
        1,
        "data",
        "batch",
        Cause.CONFIG,
        ["--lrG"],
    )
    assert "--lrG unset in run A, 0.0004 in run B" in verdict.explanation


def test_runs_apart_from_their_first_snapshot_name_a_differing_seed_flag_before_the_streams(
    tmp_path: Path,
) -> None:
    a = run(tmp_path / "a", config={"--manualSeed": 7}, streams={0: {"torch": 1}})
    b = run(
        tmp_path / "b",
        hashes={0: "x", 2: "y", 4: "z", 6: "w"},
        config={"--manualSeed": None},
        streams={0: {"torch": 2}},
    )
    verdict = records_verdict(read_records(a, b))
    assert (verdict.step, verdict.phase, verdict.cause, verdict.config_keys) == (
        0,
        "init",
        Cause.CONFIG,
        ["--manualSeed"],
    )
    c = run(
        tmp_path / "c",
        hashes={0: "x", 2: "y", 4: "z", 6: "w"},
        config={"--manualSeed": 7},
        streams={0: {"torch": 2}},
    )
    verdict = records_verdict(read_records(a, c))
    assert (verdict.cause, verdict.rng) == (Cause.RNG_STATE, ["torch"])
    assert (
        "the random streams torch already differ at the first snapshot (step 0)"
        in verdict.explanation
    )


def test_an_optimizer_setting_no_argument_names_is_the_config(tmp_path: Path) -> None:
    a = run(tmp_path / "a")
    b = run(tmp_path / "b", hashes={2: "moved"}, losses={1: 2.0})
    records = read_records(a, b)
    # a weight decay read from a config file: no argument differs, the optimizer's setting does
    records.differences = replace(
        records.differences,
        settings=SettingsDifference(step=0, differing={"optimizer.0.weight_decay": [0.01, 0.05]}),
    )
    verdict = records_verdict(records)
    assert (verdict.cause, verdict.config_keys) == (Cause.CONFIG, ["optimizer.0.weight_decay"])
    assert violation(verdict, Signals.of_records(records)) is None


@pytest.mark.parametrize(
    ("keys", "reseeded", "refused"),
    [
        # run B relaunched with run A's arguments is put to the test
        (["--split-seed"], False, None),
        (["--eval-every"], False, None),
        (["--workers", "--lr"], False, None),  # not the parallelism alone
        (["--network"], False, None),
        (["--subprocesses"], False, None),
        (["--workers"], False, "only the parallelism differs"),
        (["--num-workers"], False, "only the parallelism differs"),
        (["--num_workers", "-j"], False, "only the parallelism differs"),
        (["--dataloader-threads"], False, "only the parallelism differs"),
        (["--sample-seed"], True, "reseeded from entropy"),  # the streams' cause
        ([], False, "no argument differs"),
    ],
)
def test_arguments_are_put_to_the_test_for_a_batch_only_where_the_rule_allows(
    keys: list[str], reseeded: bool, refused: str | None
) -> None:
    why = arguments_not_named_for_data(keys, reseeded)
    assert (why is None) if refused is None else (why is not None and refused in why), why


@pytest.mark.parametrize(
    ("keys", "reseeded", "refused"),
    [
        (["--workers"], False, None),  # no indices: the relaunch tells order from nothing else
        (["--sample-seed"], True, "reseeded from entropy"),
        ([], False, "no argument differs"),
    ],
)
def test_a_worker_count_is_put_to_the_test_where_no_sample_indices_were_recorded(
    keys: list[str], reseeded: bool, refused: str | None
) -> None:
    why = arguments_not_named_for_data(keys, reseeded, order_recorded=False)
    assert (why is None) if refused is None else (why is not None and refused in why), why
