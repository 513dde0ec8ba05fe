"""The determinism-test helpers: record twice in fresh processes, compare, fail with the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_repro.store.run import Run
from bisect_repro.testing import assert_reproducible, assert_reproducible_script


def test_a_seeded_recipe_passes_and_keeps_its_runs_under_tmp_path(
    reproducibility, examples, tmp_path
) -> None:
    result = reproducibility.recipe(
        f"{examples / 'mlp.py'}:build", steps=6, every=3, config={"hidden": 8, "lr": 0.002}
    )
    assert result.identical and result.verdict is None
    assert sorted(p.name for p in (tmp_path / "reproducibility-1").iterdir()) == ["a", "b"]


def test_a_recipe_initialised_without_a_seed_fails_with_the_verdict_and_the_fix(
    examples, tmp_path
) -> None:
    target = f"{examples / 'unseeded_init.py'}:build"
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_reproducible(target, steps=4, every=2, out=tmp_path)
    lines = str(failure.value).splitlines()
    assert (
        lines[0]
        == f"{target} is not reproducible: the runs diverge at step 0, init, layer 0, tensor "
        "0.weight."
    )
    assert lines[1] == "Cause: a random stream not seeded alike (torch), proven."
    assert lines[2].startswith("The runs start from different states (0.weight differs at step 0)")
    assert lines[3].startswith("Fix: ") and "torch.manual_seed(seed)" in lines[3]
    assert lines[4] == f"The two runs and an HTML report: {tmp_path / 'report.html'}"
    assert "0.weight" in (tmp_path / "report.html").read_text()


def test_outside_a_pytest_test_it_is_an_assertion_error(examples, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    with pytest.raises(AssertionError) as failure:
        assert_reproducible(
            f"{examples / 'unseeded_shuffle.py'}:build",
            steps=4,
            every=2,
            replay=False,
            out=tmp_path,
        )
    message = str(failure.value)
    assert (
        "the runs diverge at step 0, data, tensor batch" in message
        and "Cause: the data order, inferred." in message
    )
    assert "generator=torch.Generator().manual_seed(seed)" in message


def line_of(path, text: str, occurrence: int = 1) -> int:
    """The number of the line of ``path`` that is ``text`` (its ``occurrence``-th)."""
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == text]
    return found[occurrence - 1]


def test_a_script_with_its_own_loop(reproducibility, examples) -> None:
    script = [str(examples / "own_loop.py"), "--out", "{out}", "--steps", "6", "--every", "3"]
    assert reproducibility.script(script).identical
    with pytest.raises(pytest.fail.Exception) as failure:
        reproducibility.script([*script, "--reseed-at", "4"])
    message = str(failure.value)
    assert (
        "is not reproducible: the runs diverge at step 4, forward pass, layer body.2" in message
    ), message
    assert "Cause: a random stream not seeded alike (torch), proven." in message, message
    assert (
        "Fix: remove the reseeding from entropy (torch.seed() at " in message
        and f"own_loop.py:{line_of(examples / 'own_loop.py', 'torch.seed()', 2)}" in message
    ), message


def test_a_script_must_say_where_its_run_goes() -> None:
    with pytest.raises(ValueError, match=r"put '\{out\}' where the script takes its run directory"):
        assert_reproducible_script(["train.py", "--out", "runs/a"])


def test_a_recording_that_fails_is_reported_with_its_error(tmp_path) -> None:
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_reproducible("no_such_file.py:build", out=tmp_path)
    message = str(failure.value)
    assert message.startswith("recording run A of no_such_file.py:build failed with exit code 2: ")
    assert "error: " in message and "no_such_file.py" in message.splitlines()[-1]


@pytest.mark.slow
def test_the_second_run_stops_at_its_first_difference_from_the_first(tmp_path) -> None:
    recipes = Path(__file__).resolve().parent / "e2e" / "recipes"
    target = f"{recipes / 'counter_reseed.py'}:build"
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_reproducible(
            target, steps=60, every=5, config={"reseed_at": 7}, replay=False, out=tmp_path
        )
    assert "the runs diverge at step 7" in str(failure.value), str(failure.value)
    first, second = Run.open(tmp_path / "a"), Run.open(tmp_path / "b")
    assert first.complete and len(first.steps) == 60
    # the difference shows in the snapshot at 10; the second run stops at the one after it
    assert second.complete and second.last_step == 15 and len(second.steps) == 15
