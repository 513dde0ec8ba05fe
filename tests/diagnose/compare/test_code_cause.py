"""The cause ``code`` against fakes: named from the records where the code's SHA-256 differs, with
the file and its first differing lines, before a config that differs too and after the data and the
streams; never proven; its rule read from a finished comparison and its JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.causes.registry import REGISTRY
from bisect_repro.diagnose.compare.from_records import records_verdict
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.signals import Signals
from bisect_repro.diagnose.compare.verdict import CompareResult, Confidence, Verdict
from bisect_repro.store.run import Run
from tests.diagnose.compare.test_differences import SCRIPT, launch
from tests.diagnose.compare.test_records import run
from tests.rules_check import rule_violations

EDITED = SCRIPT.replace("lr = 0.05", "lr = 0.07")


def pair(
    tmp_path: Path, b: str = EDITED, config: dict[str, int] | None = None, **differing: Any
) -> tuple[Run, Run]:
    """Run A of the script, and run B of ``b`` (its state moved at step 4) with ``config`` and
    ``differing`` in its records."""
    a = run(tmp_path / "a", launch=launch(tmp_path / "A" / "train.py", SCRIPT), config={"lr": 1})
    b_run = run(
        tmp_path / "b",
        launch=launch(tmp_path / "B" / "train.py", b),
        hashes={4: "moved"},
        losses={3: 0.5},
        config=config or {"lr": 1},
        **differing,
    )
    return a, b_run


def test_code_that_differs_is_named_with_the_file_and_its_first_differing_line(
    tmp_path: Path,
) -> None:
    verdict = records_verdict(read_records(*pair(tmp_path)))
    assert (verdict.step, verdict.cause, verdict.confidence) == (3, Cause.CODE, Confidence.INFERRED)
    assert verdict.explanation.endswith(
        "the runs ran different code: train.py (sha256 "
        + f"{launch(tmp_path / 'A' / 'train.py')['code']['sha256'][:12]} in run A, "
        + f"{launch(tmp_path / 'B' / 'train.py')['code']['sha256'][:12]} in run B), "
        + "first differing at line 3: 'lr = 0.05' in run A, 'lr = 0.07' in run B"
    )
    assert verdict.fix.startswith("run both from the same code (train.py (sha256 ")
    assert "'lr = 0.07' in run B" in verdict.fix


def test_code_outranks_a_config_that_differs_too_and_yields_to_the_data(tmp_path: Path) -> None:
    code_and_config = records_verdict(read_records(*pair(tmp_path / "1", config={"lr": 2})))
    assert code_and_config.cause is Cause.CODE and code_and_config.config_keys == []
    # the sample order of step 2 differs: the data is named first
    order = records_verdict(read_records(*pair(tmp_path / "2", orders={2: "other"})))
    assert (order.step, order.cause) == (2, Cause.DATA_ORDER)
    # the same code: the config is named
    same = records_verdict(read_records(*pair(tmp_path / "3", b=SCRIPT, config={"lr": 2})))
    assert same.cause is Cause.CONFIG


def test_code_is_named_only_where_its_hash_differs_and_never_proven_without_an_experiment(
    tmp_path: Path,
) -> None:
    entry = REGISTRY[Cause.CODE]
    verdict = Verdict(step=3, cause=Cause.CODE)
    assert entry.holds(Signals(code=("train.py",)), verdict)
    assert not entry.holds(Signals(config=("lr",)), verdict)
    assert "inferred" in entry.unproven and entry.proof.startswith("none")
    records = read_records(*pair(tmp_path))
    result = CompareResult(
        runs=["a", "b"],
        differences=records.differences,
        first_log_difference=records.logs,
        verdict=records_verdict(records),
    )
    assert Signals.of_result(result).code == ("train.py",)
    assert rule_violations(result) == []
    assert rule_violations(CompareResult.from_json(result.to_json())) == []
    # where the runs ran the same code, a verdict naming it breaks its rule
    same = read_records(*pair(tmp_path / "same", b=SCRIPT))
    assert same.differences.code == ()
    result.differences = same.differences
    assert rule_violations(result)[0].startswith("code requires that the script's")
