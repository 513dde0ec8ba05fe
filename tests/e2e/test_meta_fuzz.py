"""Property: whatever any field of ``run.json`` holds, the CLI answers with exit 0, 1 or 2, never a
traceback.

A genuine run is recorded once; each example replaces one field anywhere in its ``run.json`` (or
removes it) with an arbitrary JSON value, then runs ``show`` and ``compare`` (against an untouched
copy, with and without ``--no-replay``). Exit 2 must come with one error line naming the file.
``BISECT_REPRO_FUZZ_EXAMPLES`` sets the number of examples.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_RUN: dict[str, Path] = {}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "\x00",
            "\x1b[2K",
            "[red]x[/]",
            "../../etc",
            "os:system",
            "script",
            "module",
            "recipe",
            "0" * 64,
            "/" + "x" * 5000,
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def recorded() -> Path:
    """One run, recorded once per session (hypothesis runs the test body many times)."""
    if "run" not in _RUN:
        folder = Path(tempfile.mkdtemp(prefix="bisect-repro-meta-fuzz-"))
        result = runner.invoke(
            app,
            [
                "record",
                f"{EXAMPLES / 'mlp.py'}:build",
                "--out",
                str(folder / "run"),
                "--quiet",
                "--steps",
                "2",
                "--every",
                "1",
            ],
        )
        assert result.exit_code == 0, result.output
        _RUN["run"] = folder / "run"
    return _RUN["run"]


def paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree[:3]):
            found += paths(value, (*prefix, index))
    return found


def mutated(
    meta: dict[str, Any], where: tuple[Any, ...], value: Any, remove: bool
) -> dict[str, Any]:
    meta = json.loads(json.dumps(meta))
    parent = meta
    for key in where[:-1]:
        parent = parent[key]
    if remove and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return meta


def answers_or_one_line(case: Path, edited: Path, mutation: tuple[Any, Any]) -> None:
    """``show`` of run B and ``compare`` of A with B (records only, then with the replay) answer
    with exit 0, 1 or 2, never a traceback; exit 2 is one line naming ``edited``."""
    for command in (
        ["show", str(case / "b")],
        ["compare", str(case / "a"), str(case / "b"), "--no-replay"],
        ["compare", str(case / "a"), str(case / "b")],
    ):
        result = runner.invoke(app, command)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            mutation,
            result.exception,
        )
        assert result.exit_code in (0, 1, 2) and "Traceback" not in result.output, (
            mutation,
            result.output,
        )
        if result.exit_code == 2:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"error: {edited}: "), (
                mutation,
                result.stderr,
            )
    shutil.rmtree(case)


@pytest.fixture(scope="module")
def run_json() -> dict[str, Any]:
    return json.loads((recorded() / "run.json").read_text())


@settings(
    max_examples=int(os.environ.get("BISECT_REPRO_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), value=values, remove=st.booleans())
def test_any_field_of_run_json_gives_an_answer_or_one_line(
    run_json: dict[str, Any], tmp_path: Path, data, value, remove
) -> None:
    where = data.draw(st.sampled_from(paths(run_json)))
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copytree(recorded(), case / "b")
    shutil.copytree(recorded(), case / "a")
    (case / "b" / "run.json").write_text(json.dumps(mutated(run_json, where, value, remove)))
    answers_or_one_line(case, case / "b" / "run.json", (where, value))


@settings(
    max_examples=int(os.environ.get("BISECT_REPRO_FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    line=st.integers(min_value=0, max_value=2),
    key=st.sampled_from(["step", "loss", "order", "batch", "seeded"]),
    value=values,
)
def test_any_field_of_a_step_line_gives_an_answer_or_one_line(
    tmp_path: Path, line: int, key: str, value: Any
) -> None:
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copytree(recorded(), case / "a")
    shutil.copytree(recorded(), case / "b")
    log = case / "b" / "rank0" / "steps.jsonl"
    lines = [json.loads(text) for text in log.read_text().splitlines()]
    lines[line % len(lines)][key] = value
    lines[line % len(lines)].setdefault(
        "seeded", [{"call": "torch.seed()", "stream": "torch", "where": "x.py:1", "entropy": True}]
    )
    log.write_text("".join(json.dumps(record) + "\n" for record in lines))
    answers_or_one_line(case, log, (key, value))
