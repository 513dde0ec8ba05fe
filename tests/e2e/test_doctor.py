"""``bisect-repro doctor`` end to end through the CLI: each scenario found, named and proven, and
the same recipe fixed as the finding says comes back clean."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()

# What a clean bill may still hold: settings that bite elsewhere, and streams nothing draws from
# yet.
ENVIRONMENT_IDS = {"threads-unpinned", "tf32", "cudnn-benchmark"}


def doctor(target: str, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["doctor", target, "--json", *args])
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "bisect-repro/doctor/1"
    assert report["reproducible"] == (result.exit_code == 0)
    return result.exit_code, report


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def the(report: dict, id: str) -> dict:
    found = [f for f in report["findings"] if f["id"] == id]
    assert len(found) == 1, f"{id} not found once in {report['findings']}"
    assert set(found[0]) == {"id", "severity", "layer", "op", "evidence", "fix"}
    return found[0]


def assert_clean(code: int, report: dict) -> None:
    assert code == 0 and not errors(report), [(f["id"], f["evidence"]) for f in errors(report)]
    for finding in report["findings"]:
        assert finding["id"] in ENVIRONMENT_IDS or finding["severity"] == "info", finding


def test_model_initialised_without_a_seed(examples) -> None:
    code, report = doctor(f"{examples / 'unseeded_init.py'}:build")
    assert code == 1 and [f["id"] for f in errors(report)] == ["unseeded-init"]
    finding = the(report, "unseeded-init")
    assert (
        finding["layer"] == "0"
        and "0.weight" in finding["evidence"]
        and "torch (" in finding["evidence"]
    )
    assert "torch.manual_seed(seed)" in finding["fix"]


def test_shuffle_without_a_seeded_generator_and_its_fix(examples) -> None:
    code, report = doctor(f"{examples / 'unseeded_shuffle.py'}:build")
    assert code == 1 and [f["id"] for f in errors(report)] == ["unseeded-shuffle"]
    finding = the(report, "unseeded-shuffle")
    assert "batch 0 holds samples" in finding["evidence"] and "no generator=" in finding["evidence"]
    assert "generator=torch.Generator().manual_seed(seed)" in finding["fix"]
    code, fixed = doctor(f"{examples / 'unseeded_shuffle.py'}:build", "--set", "seeded_loader=true")
    assert_clean(code, fixed)
    # torch's global stream is still unseeded there, and doctor says so without calling it an error
    assert the(fixed, "unseeded-stream:torch")["severity"] == "info"


def test_dataset_with_its_own_unseeded_generator(examples) -> None:
    code, report = doctor(f"{examples / 'augment_rng.py'}:build")
    assert code == 1 and [f["id"] for f in errors(report)] == ["unseeded-stream:loader.dataset.rng"]
    finding = the(report, "unseeded-stream:loader.dataset.rng")
    assert "same samples" in finding["evidence"] and "numpy.random.Generator" in finding["evidence"]
    assert "shown here" in finding["evidence"]  # proven by drawing again, not guessed from a digest
    assert "np.random.default_rng(seed)" in finding["fix"]


def test_nondeterministic_op_in_the_forward_pass(examples) -> None:
    code, report = doctor(f"{examples / 'forward_nondeterministic.py'}:build", "--steps", "2")
    assert code == 1
    finding = the(report, "nondeterministic-op")
    assert finding["layer"] == "pool" and "index_put" in finding["op"]
    assert "forward pass of pool" in finding["evidence"]
    # where the step's own re-runs also differed (a racing kernel need not, on a busy machine),
    # the evidence names the first tensor they differ at
    if "first differs at" in finding["evidence"]:
        assert "pool.output" in finding["evidence"], finding["evidence"]
    assert "torch.use_deterministic_algorithms(True)" in finding["fix"]


def test_nondeterministic_op_in_the_backward_pass_and_its_fix(examples) -> None:
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    # the recipe sets 2 threads for itself; doctor must not leave them set here
    torch.set_num_threads(1)
    try:
        code, report = doctor(f"{examples / 'lookup.py'}:build")
        assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (
            1,
            deterministic,
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 1
    finding = the(report, "nondeterministic-op")
    assert finding["layer"] == "embed" and "index_put" in finding["op"]
    assert (
        "backward pass of embed" in finding["evidence"]
        and "embed.table.grad" in finding["evidence"]
    )
    assert "max ULP distance" in finding["evidence"]
    assert_clean(
        *doctor(f"{examples / 'lookup.py'}:build", "--steps", "2", "--set", "deterministic=true")
    )


def test_fully_seeded_recipe_with_two_workers_gets_a_clean_bill(examples) -> None:
    code, report = doctor(f"{examples / 'mlp.py'}:build", "--set", "num_workers=2")
    assert_clean(code, report)
    assert not [f for f in report["findings"] if f["id"].startswith("unseeded")]


def test_vocabulary_ordered_by_string_hashing(examples, monkeypatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    code, report = doctor(f"{examples / 'string_vocab.py'}:build", "--steps", "1")
    assert code == 1 and [f["id"] for f in errors(report)] == ["pythonhashseed"]
    finding = the(report, "pythonhashseed")
    assert "two more processes with the same two values reproduce each" in finding["evidence"]
    assert "PYTHONHASHSEED=0" in finding["fix"] and "sorted" in finding["fix"]


def test_environment_audit_without_a_target() -> None:
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (
        report["schema"] == "bisect-repro/doctor/1"
        and report["reproducible"]
        and report["target"] is None
    )
    ids = {f["id"] for f in report["findings"]}
    assert "versions" in ids and not errors(report)
    for finding in report["findings"]:
        assert finding["evidence"] and finding["fix"]
    human = runner.invoke(app, ["doctor"])
    assert human.exit_code == 0 and "Nothing in this environment alone" in human.stdout
    assert human.stdout.index("Nothing in this environment alone") < human.stdout.index("Fix:")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["examples/no_such_recipe.py:build"], "no such recipe file"),
        (["not a target"], "expected TARGET"),
        (["--set", "lr=1"], "--set needs a TARGET"),
        (["bisect_repro.demo:build", "--steps", "0"], "--steps 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["doctor", *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_recipe_that_fails_to_build_or_cannot_step_is_named(tmp_path) -> None:
    (tmp_path / "broken.py").write_text("def build():\n    raise ValueError('no data here')\n")
    result = runner.invoke(app, ["doctor", f"{tmp_path / 'broken.py'}:build"])
    assert (
        result.exit_code == 2 and "broken.py" in result.stderr and "no data here" in result.stderr
    )
    assert "Traceback" not in result.output
    (tmp_path / "loop.py").write_text(
        "import torch\nfrom bisect_repro import Trainee\n"
        "def build():\n"
        "    m = torch.nn.Linear(2, 1)\n"
        "    return Trainee(m, torch.optim.SGD(m.parameters(), lr=0.1), [torch.ones(2)])\n"
    )
    result = runner.invoke(app, ["doctor", f"{tmp_path / 'loop.py'}:build"])
    assert (
        result.exit_code == 2
        and "no step function" in result.stderr
        and "Traceback" not in result.output
    )
