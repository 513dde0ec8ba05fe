"""The verdict from two runs' records alone (nothing replayed), on run directories written through
the store."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.from_records import records_verdict
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.verdict import Confidence, Evidence, Verdict
from bisect_repro.store.run import Run
from tests.fakes import write_run

STEPS = 6


def run(
    path: Path,
    *,
    hashes: Mapping[int, str] | None = None,
    streams: Mapping[int, Mapping[str, Any]] | None = None,
    losses: Mapping[int, float] | None = None,
    orders: Mapping[int, str | None] | None = None,
    batches: Mapping[int, str] | None = None,
    seeded: Mapping[int, dict[str, Any]] | None = None,
    **meta: Any,
) -> Run:
    """Six steps, a snapshot every two; each step's loss, order and batch alike unless given."""
    lines = []
    for step in range(STEPS):
        line = {
            "step": step,
            "loss": (losses or {}).get(step, 1.0),
            "order": (orders or {}).get(step, f"o{step}"),
            "batch": (batches or {}).get(step, f"b{step}"),
        }
        if step in (seeded or {}):
            line["seeded"] = [(seeded or {})[step]]
        lines.append(line)
    hashes = {0: "w0", 2: "w2", 4: "w4", 6: "w6", **(hashes or {})}
    snapshots = {
        s: {"hashes": {"fc.weight": h}, "streams": dict((streams or {}).get(s, {}))}
        for s, h in hashes.items()
    }
    return write_run(path, lines, snapshots, **meta)


def verdict_of(a: Run, b: Run) -> Verdict:
    verdict = records_verdict(read_records(a, b))
    assert verdict.confidence is Confidence.INFERRED  # the records alone never prove a cause
    return verdict


def test_an_entropy_seeding_call_logged_in_the_divergent_step_names_the_stream_and_its_call_site(
    tmp_path: Path,
) -> None:
    call = {"stream": "torch", "call": "torch.seed()", "entropy": True, "where": "train.py:9"}
    a = run(tmp_path / "a")
    b = run(tmp_path / "b", hashes={4: "moved", 6: "moved"}, losses={3: 2.5}, seeded={3: call})
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.cause, verdict.rng, verdict.reseeded) == (
        3,
        Cause.RNG_STATE,
        ["torch"],
        [SeedingCall.from_json(call)],
    )
    assert verdict.evidence[1] == Evidence(
        experiment="records",
        subject="the step logs",
        outcome="differs",
        detail="step 3 reseeded from entropy: torch.seed() at train.py:9",
    )
    assert verdict.explanation == (
        "from the records alone: the runs first differ at or before step 3; torch reseeded from "
        "entropy, as the step log shows"
    )
    assert (
        verdict.fix
        == "remove the reseeding from entropy (torch.seed() at train.py:9), or give it a seed: "
        "torch.manual_seed(seed)"
    )


def test_an_entropy_seeding_call_without_a_call_site_is_named_by_its_call(tmp_path: Path) -> None:
    a = run(tmp_path / "a")
    for name, call in (
        ("b", {"stream": "torch", "call": "torch.seed()", "entropy": True, "where": None}),
        ("c", {"call": "torch.seed()"}),
    ):
        verdict = verdict_of(
            a, run(tmp_path / name, hashes={4: "moved"}, losses={3: 2.5}, seeded={3: call})
        )
        assert (verdict.step, verdict.cause) == (3, Cause.RNG_STATE)
        assert verdict.evidence[1].detail == "step 3 reseeded from entropy: torch.seed()"
    # the call does not say which stream it seeded, and no stream moved differently
    assert verdict.rng == []
    assert verdict.explanation.endswith("; a stream reseeded from entropy, as the step log shows")


def test_batches_of_other_samples_name_the_data_order_and_the_loader_streams_that_moved(
    tmp_path: Path,
) -> None:
    same = {"loader.generator": 1, "torch": 1, "python": 1}
    a = run(
        tmp_path / "a", streams={0: same, 2: same, 4: {**same, "loader.generator": 3, "python": 3}}
    )
    b = run(
        tmp_path / "b",
        streams={0: same, 2: same, 4: {**same, "loader.generator": 4, "python": 4}},
        orders={3: "other"},
        batches={3: "other"},
        hashes={4: "moved"},
    )
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.phase, verdict.tensor, verdict.cause) == (
        3,
        "data",
        "batch.indices",
        Cause.DATA_ORDER,
    )
    # python moved too, but a loader does not shuffle from it
    assert verdict.rng == ["loader.generator"]
    assert verdict.explanation.endswith("; the batches hold different samples")
    assert verdict.fix.startswith(
        "shuffle from a seeded stream: DataLoader(..., shuffle=True, generator="
    )


def test_batches_that_differ_without_recorded_indices_are_not_told_apart_from_the_order(
    tmp_path: Path,
) -> None:
    orders = dict.fromkeys(range(STEPS))
    a = run(
        tmp_path / "a", orders=orders, streams={0: {"torch": 1}, 2: {"torch": 1}, 4: {"torch": 2}}
    )
    b = run(
        tmp_path / "b",
        orders=orders,
        batches={1: "other"},
        hashes={2: "moved"},
        streams={0: {"torch": 1}, 2: {"torch": 5}},
    )
    verdict = verdict_of(a, b)
    # the data of step 1 differs; with the order unknown, the cause is the next signal: torch came
    # apart
    assert (verdict.step, verdict.phase, verdict.tensor, verdict.cause, verdict.rng) == (
        1,
        "data",
        "batch",
        Cause.RNG_STATE,
        ["torch"],
    )
    assert (
        "the loader's sample indices were not recorded, so order and content are not told apart"
        in verdict.explanation
    )
    assert verdict.explanation.endswith(
        "; the random streams torch changed between the last equal snapshot and the first "
        "divergent one"
    )


def test_a_config_key_that_differs_is_named_with_both_values(tmp_path: Path) -> None:
    a = run(tmp_path / "a", config={"lr": 0.1, "out": "runs/a/logs"})
    b = run(
        tmp_path / "b",
        config={"lr": 0.2, "out": "runs/b/logs"},
        losses={3: 0.5, 4: 0.5, 5: 0.5},
        hashes={4: "moved"},
    )
    records = read_records(a, b)
    # a folder named after each run is no cause
    assert records.differences.config == {"lr": [0.1, 0.2]} and records.run_names == ["out"]
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.cause, verdict.config_keys) == (3, Cause.CONFIG, ["lr"])
    assert verdict.explanation.endswith("; the settings differ (lr 0.1 in run A, 0.2 in run B)")
    assert verdict.fix == "record both runs with the same settings (lr: 0.1 vs 0.2)"


@pytest.mark.parametrize(("batch_from", "cause"), [(2, Cause.CONFIG), (3, Cause.RNG_STATE)])
def test_a_stream_that_moved_after_a_setting_changed_the_batch_is_no_cause(
    tmp_path: Path, batch_from: int, cause: Cause
) -> None:
    """Snapshots equal at steps 0 and 2, torch apart at step 4. Where the batch already differs
    at step 2, the window's first step, the stream's move cannot be placed before it and the
    setting is named; where the batch parts at step 3, torch may have moved first."""
    streams = {0: {"torch": 1}, 2: {"torch": 1}}
    a = run(
        tmp_path / "a",
        orders=dict.fromkeys(range(STEPS)),
        streams={**streams, 4: {"torch": 2}},
        config={"k": 8},
    )
    b = run(
        tmp_path / "b",
        orders=dict.fromkeys(range(STEPS)),
        batches={s: "other" for s in range(batch_from, STEPS)},
        hashes={4: "moved"},
        streams={**streams, 4: {"torch": 5}},
        config={"k": 7},
    )
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.phase, verdict.cause) == (batch_from, "data", cause)
    assert verdict.config_keys == (["k"] if cause is Cause.CONFIG else [])


def test_a_stream_that_differed_from_the_start_but_never_moved_is_not_the_cause(
    tmp_path: Path,
) -> None:
    a = run(
        tmp_path / "a",
        streams={s: {"numpy": 1} for s in (0, 2, 4)},
        environment={"torch.get_num_threads": 1},
    )
    b = run(
        tmp_path / "b",
        streams={s: {"numpy": 2} for s in (0, 2, 4)},
        environment={"torch.get_num_threads": 4},
        hashes={4: "moved"},
    )
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.cause, verdict.environment_keys, verdict.rng) == (
        3,
        Cause.ENVIRONMENT,
        ["torch.get_num_threads"],
        [],
    )
    assert verdict.evidence[-1] == Evidence(
        experiment="records",
        subject="both runs",
        outcome="inconclusive",
        detail="numpy differed from the start but did not move between steps 2 and 4: nothing drew "
        "from them, so they are not the cause",
    )
    assert (
        verdict.fix
        == "pin the thread count in both runs: torch.set_num_threads(N) and OMP_NUM_THREADS=N"
    )


def test_a_stream_that_differs_but_never_moves_is_unused_and_one_that_moves_is_not(
    tmp_path: Path,
) -> None:
    def state(value: int) -> dict[str, Any]:
        return {"kind": "python", "state": [value]}

    still_a, still_b = state(1), state(2)  # differ from the start, never drawn from
    a = run(
        tmp_path / "a",
        streams={s: {"python": still_a, "torch": state(10 + s)} for s in (0, 2, 4, 6)},
    )
    b = run(
        tmp_path / "b",
        streams={
            s: {"python": still_b, "torch": state(10 + s if s < 4 else 99 + s)}
            for s in (0, 2, 4, 6)
        },
    )
    records = read_records(a, b)
    assert [row.streams for row in records.timeline] == [
        ["python"],
        ["python"],
        ["python", "torch"],
        ["python", "torch"],
    ]
    assert records.unused_streams() == ["python"]


def test_a_loader_setting_that_differs_is_named_with_the_config_key_that_set_it(
    tmp_path: Path,
) -> None:
    def recorded(name: str, batch_size: int, lr: float) -> Run:
        lines = [
            {"step": s, "loss": 1.0, "order": f"o{s}", "batch": f"{name}{s}"} for s in range(4)
        ]
        snapshots = {
            s: {
                "hashes": {"fc.weight": f"w{s}" if s == 0 else f"{name}{s}"},
                "settings": {"optimizer.group0.lr": lr},
            }
            for s in (0, 2, 4)
        }
        loader = {"kind": "DataLoader", "batch_size": batch_size, "num_workers": 0}
        return write_run(
            tmp_path / name,
            lines,
            snapshots,
            config={"batch_size": batch_size, "seed": 0},
            loader=loader,
        )

    records = read_records(recorded("a", 16, 0.1), recorded("b", 32, 0.1))
    assert records.differences.settings is not None and records.differences.settings.step == 0
    assert records.differences.settings.differing == {
        "loader.batch_size": [16, 32]
    } and records.differences.settings.config_keys == ["batch_size"]
    verdict = records_verdict(records)
    assert any(
        e.subject == "the snapshots' settings" and "loader.batch_size (16 vs 32)" in e.detail
        for e in verdict.evidence
    )


def test_a_rank_whose_records_explain_nothing_follows_the_rank_that_parted_first() -> None:
    from bisect_repro.diagnose.compare.roles import through_collectives

    first = Verdict(
        step=5,
        rank=1,
        cause=Cause.RNG_STATE,
        rng=["torch"],
        fix="remove the reseeding",
        explanation="rank 1's own",
    )
    silent = Verdict(step=5, rank=0, explanation="nothing in the records explains it")
    followed = through_collectives(silent, first)
    assert followed is not None and (followed.cause, followed.rng, followed.confidence) == (
        Cause.RNG_STATE,
        ["torch"],
        Confidence.INFERRED,
    )
    assert (
        "rank 1 parted first, at step 5" in followed.explanation
        and followed.fix == "remove the reseeding"
    )
    assert silent.cause is Cause.UNKNOWN  # the rank's own verdict is not changed in place
    earlier = Verdict(step=3, rank=0)  # parted before the first rank's cause: not explained by it
    own = Verdict(step=5, rank=0, cause=Cause.ENVIRONMENT)  # a cause of its own stays
    assert through_collectives(earlier, first) is earlier and through_collectives(own, first) is own
    # its own records name a cause, but another rank's log differed first
    received = through_collectives(own, first, receiver=True)
    assert (
        received is not None
        and received.cause is first.cause
        and f"rank {first.rank} parted first" in received.explanation
    )
    assert (
        through_collectives(None, first) is None
        and through_collectives(silent, Verdict(step=5, rank=1)) is silent
    )


@pytest.mark.parametrize("torch_drawn", [True, False])
def test_at_initialisation_the_streams_drawn_from_later_are_named_before_unmoved_ones(
    tmp_path: Path, torch_drawn: bool
) -> None:
    """The weights differ at the first snapshot, where torch and numpy differ too. Torch drawn
    from afterwards (dropout) is named alone; where neither moves, both are named, and the words
    say the records cannot tell whether the build drew from them."""

    def streams(offset: int) -> dict[int, dict[str, int]]:
        return {
            s: {"torch": offset + (s if torch_drawn else 0), "numpy": offset} for s in (0, 2, 4, 6)
        }

    hashes = {s: f"other{s}" for s in (0, 2, 4, 6)}
    a = run(tmp_path / "a", streams=streams(0))
    b = run(tmp_path / "b", streams=streams(100), hashes=hashes)
    verdict = verdict_of(a, b)
    assert (verdict.step, verdict.phase, verdict.cause) == (0, "init", Cause.RNG_STATE)
    assert sorted(verdict.rng) == (["torch"] if torch_drawn else ["numpy", "torch"])
    unknown = "whether the build drew from them is not recorded"
    assert (unknown in verdict.explanation) is not torch_drawn, verdict.explanation
