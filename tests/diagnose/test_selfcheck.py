"""Does a step repeat from the same state, and if not, why: each classification, on a fake
replica."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.diagnose.selfcheck import check_repeats
from tests.fake_programs import one_layer, reseeding
from tests.fake_replica import Call, FakeReplica, Outcome, Program


def kept(program: Program) -> FakeReplica:
    """A replica standing at step 0, its start kept."""
    replica = FakeReplica(program)
    replica.connect()
    replica.fetch()
    return replica


def test_a_step_that_computes_the_same_from_the_same_state_repeats() -> None:
    found = check_repeats(kept(Program(step=one_layer)), 0)
    assert (found.kind, found.repeats, found.streams, found.hidden, found.op, found.first) == (
        "repeats",
        True,
        [],
        None,
        None,
        None,
    )
    assert found.trace is not None and [e.tensor for e in found.trace.entries][:2] == [
        "batch.indices",
        "batch.0",
    ]


def test_a_step_that_reseeds_a_stream_from_entropy_is_proven_so_by_fixing_the_entropy() -> None:
    found = check_repeats(kept(Program(step=reseeding)), 0)
    assert (found.kind, found.streams, found.reseed_proven) == ("reseeded", ["torch"], True)
    assert found.reseeds == [SeedingCall("torch", "torch.seed()", True, "train.py:12")]
    assert (
        found.trace is not None
        and found.first is not None
        and found.trace.entries[found.first].tensor == "fc.output"
    )


def test_a_reseed_that_fixing_the_entropy_does_not_remove_is_not_proven() -> None:
    # torch.manual_seed(time.time_ns()): an explicit seed, never fixed
    def from_the_clock(call: Call) -> Outcome:
        seeded = SeedingCall("torch", "torch.manual_seed(...)", False, "train.py:30").to_json()
        return one_layer(call, streams={**call.streams, "torch": call.entropy}, seeding=[seeded])

    found = check_repeats(kept(Program(step=from_the_clock)), 0)
    assert (found.kind, found.streams, found.reseed_proven, found.reseeds) == (
        "reseeded",
        ["torch"],
        False,
        [],
    )


def test_a_step_that_takes_another_branch_when_run_again_reads_hidden_state() -> None:
    found = check_repeats(
        kept(Program(step=lambda call: one_layer(call, branch=call.calls % 2 == 1))), 0
    )
    assert found.kind == "hidden_state" and not found.first_run_only and found.op is None
    assert (
        found.hidden
        == "re-run from the same state, step 0 traced other tensors: it took another branch"
    )
    assert (
        found.trace is not None
        and found.first is not None
        and found.trace.entries[found.first].tensor == "fc.weight.grad"
    )


def test_an_op_handed_other_python_arguments_from_the_same_state_reads_hidden_state() -> None:
    found = check_repeats(
        kept(Program(step=lambda call: one_layer(call, scale=str(call.calls)))), 0
    )
    assert found.kind == "hidden_state" and found.hidden is not None and found.op is None
    assert found.hidden.startswith(
        "re-run from the same state, aten.mul.Tensor received other Python arguments in step 0 ("
    )
    assert found.hidden.endswith("): a value from outside the restored state")


def test_an_op_that_gives_other_outputs_on_identical_inputs_in_two_pairs_is_nondeterministic() -> (
    None
):
    found = check_repeats(kept(Program(step=lambda call: one_layer(call, kernel=call.entropy))), 0)
    assert (found.kind, found.hidden, found.op_pairs) == ("nondeterministic_op", None, 2)
    assert found.op is not None and (found.op.op, found.op.layer, found.op.phase) == (
        "aten.index_add_.default",
        "fc",
        "backward",
    )
    assert (
        found.trace is not None
        and found.first is not None
        and found.trace.entries[found.first].tensor == "fc.weight.grad"
    )
    assert [(row.op, row.first, row.inputs_equal, row.outputs_equal) for row in found.context] == [
        # only the backward pass was traced: the phase the trace first differs in
        ("aten.index_add_.default", True, True, False)
    ]


def test_a_step_whose_first_run_alone_differs_is_noted_as_a_suspicion() -> None:
    found = check_repeats(
        kept(
            Program(step=lambda call: one_layer(call, forward="cold" if call.runs == 0 else None))
        ),
        0,
    )
    assert (found.kind, found.first_run_only, found.op) == ("hidden_state", True, None)
    assert found.hidden == (
        "step 0 run again from the same state computes the same each time, but not what its first "
        "run computed: "
        "it behaves differently once it has run"
    )


def test_in_a_frameworks_process_each_run_is_the_first_of_a_fresh_process(tmp_path: Path) -> None:
    def framework(step: Callable[[Call], Outcome]) -> FakeReplica:
        replica = FakeReplica(Program(step=step, reruns=False))
        replica.connect()
        replica.restore(tmp_path, 0)
        return replica

    warm = framework(lambda call: one_layer(call, forward="cold" if call.runs == 0 else None))
    # the run, then one re-run in a fresh process
    assert check_repeats(warm, 0).repeats and warm.processes == 2
    reseeded = framework(reseeding)
    found = check_repeats(reseeded, 0)
    assert (found.kind, found.streams, found.reseed_proven, reseeded.processes) == (
        "reseeded",
        ["torch"],
        True,
        4,
    )
