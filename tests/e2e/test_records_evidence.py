"""The verdict never says "unknown" while the records name a cause: the replay's strongest evidence
yields to the records' own when no experiment can isolate the cause."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()
RECIPE = Path(__file__).resolve().parent / "recipes" / "counter_reseed.py"


def test_a_reseed_behind_a_closure_counter_is_named_from_the_step_log(tmp_path: Path) -> None:
    """The counter restarts in a replay from a checkpoint, so no replay reproduces the reseed; the
    step log of run B still records ``torch.seed()`` in step 9, with its call site."""
    for name, extra in (("a", []), ("b", ["--set", "reseed_at=9"])):
        args = [
            "record",
            f"{RECIPE}:build",
            "--out",
            str(tmp_path / name),
            "--quiet",
            "--steps",
            "14",
            "--every",
            "5",
            "--checkpoint-every",
            "5",
        ]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["cause"], verdict["rng"]) == (9, "rng_state", ["torch"]), verdict
    assert verdict["confidence"] in ("proven", "inferred")
    assert verdict["reseeded"][0]["call"] == "torch.seed()" and verdict["reseeded"][0]["where"] == f"{RECIPE}:24"
    assert f"{RECIPE}:24" in verdict["fix"]
    if verdict["confidence"] == "inferred":
        assert "the replay could not prove it" in verdict["explanation"], verdict["explanation"]
