"""Which experiment measures the envelope (run B's TF32 settings and thread count, where they differ
from run A's), whether one is measured at all (with the exact distances: only where the records
cannot tell an event from rounding, beside an exact signal where the environments differ in what
rounds, or where the user asks, ``compare --numerics``), and what is said where none can be."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from bisect_repro.diagnose.compare.differences import Differences
from bisect_repro.diagnose.compare.records import Records
from bisect_repro.diagnose.compare.verdict import TimelineRow
from bisect_repro.diagnose.numerics import envelope
from bisect_repro.diagnose.numerics.envelope import (
    _not_rounding,
    experiments,
    judge,
    measure_envelope,
    tf32_of,
)
from bisect_repro.diagnose.numerics.numerics import ExactSignal, Measured, SignalKind
from bisect_repro.diagnose.numerics.numerics_result import Distance, Envelope
from bisect_repro.store.run import Run


def run(**environment: Any) -> Any:
    return SimpleNamespace(environment=environment)


def test_the_same_tf32_settings_give_no_tf32_experiment() -> None:
    a = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "env.NVIDIA_TF32_OVERRIDE": None,
            "torch.get_num_threads": 1,
        }
    )
    b = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "env.NVIDIA_TF32_OVERRIDE": None,
            "torch.get_num_threads": 2,
        }
    )
    assert tf32_of(a, b) is None


def test_run_bs_switches_and_variables_where_they_differ() -> None:
    a = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "torch.backends.cudnn.allow_tf32": True,
            "env.NVIDIA_TF32_OVERRIDE": "0",
        }
    )
    b = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": True,
            "torch.backends.cudnn.allow_tf32": True,
            "torch.get_float32_matmul_precision": "high",
            "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
        }
    )
    switches, variables = tf32_of(a, b) or ({}, {})
    assert switches == {
        "torch.backends.cuda.matmul.allow_tf32": True,
        "torch.get_float32_matmul_precision": "high",
    }
    # None: unset in the replay
    assert variables == {"NVIDIA_TF32_OVERRIDE": None, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}


@pytest.mark.parametrize("value", ["os.system('x')", 1, ["high"], "HIGH"])
def test_a_switch_value_no_switch_takes_is_left_out(value: Any) -> None:
    a = run(**{"torch.get_float32_matmul_precision": "highest"})
    b = run(
        **{"torch.get_float32_matmul_precision": value, "torch.backends.cudnn.allow_tf32": "yes"}
    )
    assert tf32_of(a, b) is None


def test_the_experiments_in_order_the_last_one_marked() -> None:
    tried = experiments(4, None, None)
    assert [(method, last) for method, _, last in tried] == [
        ("1 torch threads instead of 4", False),
        ("every weight moved one ulp", True),
    ]
    assert [(c.threads, c.perturb, c.tf32) for _, c, _ in tried] == [
        (1, False, None),
        (4, True, None),
    ]


def test_differing_tf32_settings_are_tried_first_on_the_recorded_thread_count() -> None:
    tf32 = ({"torch.backends.cuda.matmul.allow_tf32": True}, {"NVIDIA_TF32_OVERRIDE": None})
    method, change, last = experiments(1, tf32, None)[0]
    assert (
        method == "run B's TF32 settings (torch.backends.cuda.matmul.allow_tf32=True, "
        "NVIDIA_TF32_OVERRIDE=(unset))"
    )
    assert (change.threads, change.tf32, last) == (1, tf32, False)
    assert experiments(1, tf32, None)[1][0] == "2 torch threads instead of 1"


def test_a_run_that_differs_from_itself_is_its_own_envelope_and_nothing_else() -> None:
    tf32 = ({"torch.backends.cuda.matmul.allow_tf32": True}, {})
    tried = experiments(16, tf32, "aten.index_add.default")
    assert [(m, c.threads, c.perturb, c.tf32, last) for m, c, last in tried] == [
        (
            "nothing changed (run A differs from itself: aten.index_add.default)",
            16,
            False,
            None,
            True,
        )
    ]


def test_run_bs_thread_count_is_the_threads_experiment_where_it_differs() -> None:
    method, change, _ = experiments(1, None, None, 4)[0]
    assert (method, change.threads) == ("4 torch threads instead of 1", 4)
    # the same count: 1 and 2 swapped
    assert experiments(2, None, None, 2)[0][0] == "1 torch threads instead of 2"


def test_an_envelope_that_cannot_be_measured_names_the_experiment_and_why() -> None:
    a = run(**{"torch.get_num_threads": 1})
    b = run(**{"torch.get_num_threads": 2})
    envelope, why = measure_envelope(cast(Run, a), None, cast(Run, b))
    assert envelope is None
    assert why == (
        "replaying run A with 2 torch threads instead of 1 could not run: run A is not replayed "
        "(no consent, --no-replay, or no launch recorded)"
    )


def _records(environment: dict[str, list[Any]], last_equal: int = 0) -> Records:
    single = SimpleNamespace(layout="single", world_size=1)
    row = TimelineRow(step=0, equal=True, differing_tensors=0, first_tensor=None, streams=[])
    return cast(
        Records,
        SimpleNamespace(
            a=single,
            b=single,
            differences=Differences(environment=environment),
            timeline=[row],
            last_equal=last_equal,
        ),
    )


CONFIG = [ExactSignal(SignalKind.CONFIG, 0, ("degrade_at",))]
MEASURED = Measured([Distance(step=0, relative=0.0), Distance(step=5, relative=1e-8)])


def test_a_config_key_under_another_environment_is_measured_against_that_environment() -> None:
    threads = {"torch.get_num_threads": [1, 2], "env.OMP_NUM_THREADS": ["1", "2"]}
    assert _not_rounding(_records(threads), MEASURED, CONFIG) is None
    # equal bit for bit up to step 40: the threads' rounding may show late, still measured
    assert _not_rounding(_records(threads, last_equal=40), MEASURED, CONFIG) is None


@pytest.mark.parametrize("environment", [{}, {"env.PYTHONHASHSEED": ["0", "1"]}])
def test_a_config_key_where_nothing_that_rounds_differs_is_the_cause_without_an_envelope(
    environment: dict[str, list[Any]],
) -> None:
    why = _not_rounding(_records(environment), MEASURED, CONFIG)
    assert why == (
        "config (degrade_at) differ from the start and the runs' environments agree in all that "
        "rounds: no rounding differs beside it"
    )


def _judged(
    monkeypatch: pytest.MonkeyPatch, why_not: str | None, *, asked: bool
) -> tuple[list[str], Any]:
    """``judge`` on runs whose weights differ from step 1, the records saying ``why_not`` (``None``:
    they cannot tell): what it measured, and its numerics."""
    measured: list[str] = []
    points = [Distance(step=0, relative=0.0), Distance(step=1, relative=1e-3)]
    monkeypatch.setattr(envelope, "distances", lambda a, b, exact: Measured(weights=points))
    monkeypatch.setattr(envelope, "signals_differing", lambda records, config_only: [])
    monkeypatch.setattr(envelope, "_not_rounding", lambda records, found, signals: why_not)
    monkeypatch.setattr(envelope, "add_exact", lambda found, a, b: measured.append("exact"))

    def measure(run: Any, spec: Any, other: Any, unrepeatable: Any) -> tuple[Envelope, None]:
        measured.append("envelope")
        return Envelope(method="2 torch threads instead of 1", from_step=0, points=points), None

    monkeypatch.setattr(envelope, "measure_envelope", measure)
    records = SimpleNamespace(a=SimpleNamespace(world_size=1), b=SimpleNamespace(world_size=1))
    return measured, judge(records, None, asked=asked)  # type: ignore[arg-type]


def test_an_event_the_records_explain_measures_no_envelope_and_reads_no_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    why = "the runs are equal bit for bit up to step 160"
    measured, numerics = _judged(monkeypatch, why, asked=False)
    assert measured == [] and numerics.envelope is None and why in numerics.sentence


def test_runs_the_records_cannot_tell_apart_from_rounding_measure_the_envelope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured, numerics = _judged(monkeypatch, None, asked=False)
    assert measured == ["exact", "envelope"] and numerics.envelope is not None


def test_asked_for_numerics_the_envelope_is_measured_even_where_the_records_explain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured, numerics = _judged(monkeypatch, "torch's stream differs from step 50", asked=True)
    assert measured == ["exact", "envelope"] and numerics.envelope is not None
