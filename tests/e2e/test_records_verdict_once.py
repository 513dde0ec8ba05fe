"""The records' verdict is made once per comparison and handed on: a counting spy on
:func:`~bisect_repro.diagnose.compare.from_records.records_verdict`, wherever a module of
``diagnose/`` holds it, through ``compare`` with the replay (a config the replay proves, runs that
differ from their first snapshot) and without it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bisect_repro import RecordOptions, compare, record
from bisect_repro.diagnose.compare import from_records
from bisect_repro.record.recipe import build

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``mlp`` and ``mlp_lr``: a seeded MLP and the same with another ``lr``; ``init_a`` and
    ``init_b``: a model initialised without a seed."""
    folder = tmp_path_factory.mktemp("runs")
    init, mlp = f"{EXAMPLES / 'unseeded_init.py'}:build", f"{EXAMPLES / 'mlp.py'}:build"
    plan = {
        "mlp": (mlp, {"hidden": 8}),
        "mlp_lr": (mlp, {"hidden": 8, "lr": 0.01}),
        "init_a": (init, {}),
        "init_b": (init, {}),
    }
    for name, (target, config) in plan.items():
        options = RecordOptions(steps=4, every=2, checkpoint_every=2)
        record(build(target, config), folder / name, options, target=target, config=config)
    return {name: folder / name for name in plan}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of ``records_verdict``, through every module that holds the function."""
    made: list[int] = []
    original: Callable[..., Any] = from_records.records_verdict

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (
            name.startswith("bisect_repro.")
            and getattr(module, "records_verdict", None) is original
        ):
            monkeypatch.setattr(module, "records_verdict", counted)
    return made


@pytest.mark.slow
@pytest.mark.parametrize(
    ("a", "b", "replay", "cause"),
    [
        ("mlp", "mlp_lr", True, "config"),
        ("init_a", "init_b", True, "rng_state"),
        ("mlp", "mlp_lr", False, "config"),
    ],
)
def test_the_records_verdict_is_made_once_per_comparison(
    runs: dict[str, Path], calls: list[int], a: str, b: str, replay: bool, cause: str
) -> None:
    result = compare(runs[a], runs[b], replay=replay)
    assert result.verdict is not None and result.verdict.cause.value == cause, result.verdict
    assert result.replay.performed is replay
    assert len(calls) == 1


def test_identical_runs_need_no_verdict(runs: dict[str, Path], calls: list[int]) -> None:
    assert compare(runs["mlp"], runs["mlp"], replay=False).identical and calls == []
