from __future__ import annotations

import io
import json
import math

import pytest
import torch
from rich.console import Console

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.compare import compare
from bisect_repro.diagnose.compare.verdict import CompareResult, Confidence
from bisect_repro.diagnose.difference import difference_stats
from bisect_repro.errors import RunFormatError
from bisect_repro.report.html import comparison_html
from bisect_repro.report.text import render_comparison
from bisect_repro.store.writer import RunWriter
from tests.fakes import fake_ranks


def test_ulp_distance_counts_representable_floats_between() -> None:
    a = torch.tensor([1.0, -2.0, 0.0, 5.0])
    b = a.clone()
    b[0] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    b[1] = torch.nextafter(
        torch.nextafter(torch.tensor(-2.0), torch.tensor(0.0)), torch.tensor(0.0)
    )
    b[2] = -0.0  # equal to +0.0
    stats = difference_stats(a, b)
    assert stats["max_ulp"] == 2 and stats["fraction_differing"] == 0.5
    assert math.isclose(stats["max_abs_diff"], 2 * 2**-23, rel_tol=1e-6)


def test_ulp_across_zero_and_for_half_precision() -> None:
    tiny = torch.tensor([1e-45])  # the smallest float32 subnormal, one step from zero
    assert difference_stats(tiny, -tiny)["max_ulp"] == 2
    half = torch.tensor([1.0], dtype=torch.bfloat16)
    assert difference_stats(half, torch.nextafter(half, half * 2))["max_ulp"] == 1


def test_nans_in_the_same_place_are_equal_and_integers_have_no_ulp() -> None:
    nan = torch.tensor([float("nan"), 1.0])
    assert difference_stats(nan, nan.clone())["fraction_differing"] == 0.0
    stats = difference_stats(torch.tensor([1, 2]), torch.tensor([1, 5]))
    assert stats["max_abs_diff"] == 3 and stats["fraction_differing"] == 0.5


def fake_run(path, hashes_by_step, losses, format_version=1):
    writer = RunWriter.create(
        path,
        {
            "target": None,
            "config": {},
            "model": {"parameters": {"w": [[2], "float32"]}, "buffers": {}},
            "environment": {},
        },
    )
    if format_version != 1:
        import json

        meta = json.loads((path / "run.json").read_text())
        meta["format"] = format_version
        (path / "run.json").write_text(json.dumps(meta))
    for step, loss in enumerate(losses):
        writer.append_steps([{"step": step, "loss": loss, "order": "o", "batch": "b"}])
    for step, digest in hashes_by_step.items():
        writer.commit(
            "snapshot", step, {"step": step, "hashes": {"w": digest}, "streams": {}, "data": {}}
        )
    writer.finish(max(hashes_by_step))
    return path


def test_records_only_comparison_bounds_the_divergence(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x", 5: "y", 10: "z"}, [1.0] * 10)
    b = fake_run(tmp_path / "b", {0: "x", 5: "y", 10: "Z"}, [1.0] * 7 + [2.0] * 3)
    result = compare(a, b, replay=False).to_json()
    assert result["snapshots"] == {"last_equal": 5, "first_divergent": 10}
    assert result["first_log_difference"]["loss"] == 7
    assert (
        result["verdict"]["step"] == 7
        and result["verdict"]["cause"] == "unknown"
        and result["verdict"]["confidence"] == "inferred"
    )
    assert compare(a, a, replay=False).identical


def test_runs_that_differ_from_their_first_snapshot_part_at_initialisation(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x", 5: "y"}, [1.0] * 5)
    b = fake_run(tmp_path / "b", {0: "X", 5: "Y"}, [2.0] * 5)
    verdict = compare(a, b, replay=False).to_json()["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["confidence"]) == (0, "init", "inferred")


def test_runs_of_different_formats_are_refused(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x"}, [1.0])
    b = fake_run(tmp_path / "b", {0: "x"}, [1.0], format_version=0)
    with pytest.raises(RunFormatError):
        compare(a, b, replay=False)


# -- distributed runs, rank by rank, from the records (their replay: tests/e2e/test_distributed.py)
# --


def two_ranks(
    path,
    *,
    moved: bool = False,
    reseed: bool = False,
    world: int = 2,
    where: str | None = "train.py:9",
    **distributed,
):
    """Snapshots at 0, 2, 4; with ``reseed``, rank 1 reseeds at step 3 (its loss differs there) and
    every rank's state differs from step 4 on, as a gradient all-reduce spreads it; ``where`` is the
    reseed's call site."""
    hashes = {
        r: {0: {"w": "a"}, 2: {"w": "b"}, 4: {"w": "moved" if moved or reseed else "c"}}
        for r in range(world)
    }
    losses = {r: [1.0, 1.0, 1.0, 5.0 if reseed and r == 1 else 1.0] for r in range(world)}
    return fake_ranks(
        path, hashes, losses=losses, seeded={1: {3: where}} if reseed else None, **distributed
    )


def test_distributed_runs_diverge_at_the_earliest_step_on_the_rank_where_it_starts(
    tmp_path,
) -> None:
    result = compare(
        two_ranks(tmp_path / "a"), two_ranks(tmp_path / "b", reseed=True), replay=False
    ).to_json()
    verdict = result["verdict"]
    assert (verdict["step"], verdict["rank"], verdict["cause"], verdict["rng"]) == (
        3,
        1,
        "rng_state",
        ["torch"],
    )
    assert verdict["reseeded"][0]["where"] == "train.py:9" and "rank 1" in verdict["explanation"]
    # rank 0 only bounded by its snapshots
    assert [(r["rank"], r["verdict"]["step"]) for r in result["ranks"]] == [(0, 3), (1, 3)]
    assert (
        result["ranks"][1]["timeline"][-1] == result["timeline"][-1]
        and result["first_log_difference"]["loss"] == 3
    )
    assert result["notes"] == []
    # written without code: nothing to replay
    replayed = compare(tmp_path / "a", tmp_path / "b").to_json()
    assert (
        replayed["verdict"] == verdict
        and not replayed["replay"]["performed"]
        and replayed["replay"]["commands"] == []
    )
    assert len(replayed["notes"]) == 1 and replayed["notes"][0].startswith(
        f"no replay: {tmp_path / 'a'}: the run names no script"
    )


def test_a_reseed_from_an_unknown_call_site_is_named_by_its_call_alone(tmp_path) -> None:
    result = compare(
        two_ranks(tmp_path / "a"), two_ranks(tmp_path / "b", reseed=True, where=None), replay=False
    )
    verdict = result.verdict
    assert verdict is not None and verdict.reseeded[0].where is None
    assert "step 3 reseeded from entropy: torch.seed()" in [e.detail for e in verdict.evidence]
    assert "remove the reseeding from entropy (torch.seed()), or give it a seed" in verdict.fix
    assert "<li><code>torch.seed()</code> (torch)</li>" in comparison_html(result)
    text = Console(file=io.StringIO(), width=300)
    render_comparison(result, text)
    assert "None" not in " ".join(
        [
            text.file.getvalue(),
            verdict.explanation,
            verdict.fix,
            *(e.detail for e in verdict.evidence),
        ]
    )


def test_a_comparison_reads_back_from_its_json(tmp_path) -> None:
    result = compare(
        two_ranks(tmp_path / "a"), two_ranks(tmp_path / "b", reseed=True), replay=False
    )
    found = json.loads(json.dumps(result.to_json()))
    again = CompareResult.from_json(found)
    assert again == result and again.to_json() == found
    assert (
        again.verdict is not None
        and again.verdict.cause is Cause.RNG_STATE
        and again.verdict.confidence is Confidence.INFERRED
    )


def test_identical_distributed_runs_have_a_null_verdict_on_every_rank(tmp_path) -> None:
    result = compare(two_ranks(tmp_path / "a"), two_ranks(tmp_path / "b")).to_json()
    assert result["identical"] and result["verdict"] is None
    assert [(r["rank"], r["verdict"], len(r["timeline"])) for r in result["ranks"]] == [
        (0, None, 3),
        (1, None, 3),
    ]


def test_another_world_size_or_layout_is_compared_by_distance_and_the_ranks_both_have(
    tmp_path,
) -> None:
    a, b = two_ranks(tmp_path / "a"), two_ranks(tmp_path / "b", world=3)
    for replay in (True, False):
        result = compare(a, b, replay=replay).to_json()
        assert (
            result["identical"]
            and len(result["ranks"]) == 2
            and result["replay"]["performed"] is False
        )
        assert (
            "run A ran on 2 ranks (ddp), run B on 3 ranks (ddp)" in result["notes"][0]
            and "ranks 0 to 1" in result["notes"][0]
        )
        # fakes hold none
        assert (
            result["numerics"]["rounding_only"] is False
            and "no sketches" in result["numerics"]["sentence"]
        )
    fsdp = compare(a, two_ranks(tmp_path / "c", layout="fsdp", replicated="dtensor")).to_json()
    assert "(fsdp)" in fsdp["notes"][0]
    single = fake_run(tmp_path / "d", {0: "a", 2: "b", 4: "c"}, [1.0] * 4)
    assert any("run B on 1 rank (single)" in note for note in compare(a, single).notes)
    assert compare(a, single, replay=False).ranks[0].rank == 0


def test_a_single_process_comparison_lists_its_one_rank(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x", 5: "y"}, [1.0] * 5)
    b = fake_run(tmp_path / "b", {0: "x", 5: "z"}, [1.0] * 5)
    result = compare(a, b, replay=False).to_json()
    assert result["ranks"] == [
        {
            "rank": 0,
            "node": None,
            "role": None,
            "verdict": result["verdict"],
            "timeline": result["timeline"],
        }
    ]
    assert result["verdict"]["rank"] is None  # no ranks to tell apart


def test_a_config_key_that_only_names_each_runs_directory_is_never_the_cause(tmp_path) -> None:
    def run(name: str, config: dict) -> None:
        path = tmp_path / "runs" / name
        writer = RunWriter.create(
            path,
            {
                "target": None,
                "config": config,
                "model": {"parameters": {"w": [[2], "float32"]}},
                "environment": {},
            },
        )
        writer.append_steps(
            [
                {
                    "step": s,
                    "loss": 1.0 if s < 3 or name == "a" else 2.0,
                    "order": "o",
                    "batch": "b",
                }
                for s in range(5)
            ]
        )
        writer.commit("snapshot", 0, {"step": 0, "hashes": {"w": "x"}, "streams": {}, "data": {}})
        writer.commit(
            "snapshot",
            4,
            {"step": 4, "hashes": {"w": "y" if name == "a" else "z"}, "streams": {}, "data": {}},
        )
        writer.finish(4)

    run("a", {"out": str(tmp_path / "runs" / "a"), "log_dir": "runs/a/logs", "lr": 0.1})
    run("b", {"out": str(tmp_path / "runs" / "b"), "log_dir": "runs/b/logs", "lr": 0.1})
    result = compare(tmp_path / "runs" / "a", tmp_path / "runs" / "b", replay=False)
    assert (
        result.config_diff == {}
        and result.verdict is not None
        and result.verdict.cause.value != "config"
    )
    assert any(
        "out, log_dir differ only by naming each run's own directory" in note
        for note in result.notes
    ), result.notes
    run("c", {"out": str(tmp_path / "runs" / "c"), "log_dir": "runs/c/logs", "lr": 0.2})
    result = compare(tmp_path / "runs" / "a", tmp_path / "runs" / "c", replay=False)
    assert (
        result.config_diff == {"lr": [0.1, 0.2]}
        and result.verdict.cause.value == "config"
        and result.verdict.config_keys == ["lr"]
    )


@pytest.mark.parametrize(
    ("cause", "confidence", "subject", "outcome", "expected"),
    [
        (
            Cause.NONDETERMINISTIC_OP,
            Confidence.PROVEN,
            "run A",
            "differs",
            "aten.index_add.default",
        ),
        # run A repeats: its envelope is not its own noise
        (Cause.NONDETERMINISTIC_OP, Confidence.PROVEN, "run B", "differs", None),
        (Cause.NONDETERMINISTIC_OP, Confidence.INFERRED, "run A", "differs", None),
        (Cause.NONDETERMINISTIC_OP, Confidence.PROVEN, "run A", "matches", None),
        (Cause.ENVIRONMENT, Confidence.PROVEN, "run A", "differs", None),
    ],
)
def test_the_envelope_is_run_a_against_itself_only_where_a_rerun_proved_it_differs(
    cause: Cause, confidence: Confidence, subject: str, outcome: str, expected: str | None
) -> None:
    from bisect_repro.diagnose.compare.compare import _unrepeatable
    from bisect_repro.diagnose.compare.verdict import Evidence, Verdict

    evidence = [
        Evidence(
            experiment="self_rerun",
            subject=subject,
            outcome=outcome,
            detail="step 3 run again",
            run=subject.removeprefix("run "),
        )
    ]
    verdict = Verdict(
        step=3, cause=cause, confidence=confidence, op="aten.index_add.default", evidence=evidence
    )
    assert _unrepeatable(verdict) == expected
