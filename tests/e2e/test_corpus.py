"""A corpus of training scripts in the styles of well-known public ones (``tests/e2e/corpus/``),
recorded unchanged with ``bisect-repro record --out DIR -- python script.py ARGS`` and compared
with ``bisect-repro compare A B --json``, each with one bug planted the way a user hits it: a
flag, a reseed at an epoch's end, an edited data file, the second optimizer's setting, a worker
count, an unseeded split, a seed drawn at random, an edited config file.

Every case states the verdict derived from the planted bug (the truth), not from what the tool
prints. A case where the tool's verdict is wrong is marked ``xfail(strict=True)`` with what the
tool says instead, so the mark has to go when the tool is fixed. Every verdict is also checked
against the precondition of the cause it names (:func:`precondition_violations`): what the
records must show for that cause to be named at all.

Each distinct run is recorded once per module and each pair compared once; the recordings and
reports are shared by the tests that read them. The README's test command runs the cases marked
``ci`` (one of each cause and loop shape); ``--extended`` runs every case.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import run_cli
from tests.e2e.corpus_cases import (
    CASES,
    CORPUS,
    SAME_TWICE,
    Case,
    Run,
    py,
    reverse_a_word_first_read_at,
    window_batches,
)
from tests.rules_check import assert_rules_hold

# --- the trees the runs execute in ------------------------------------------------------------


def _tree(root: Path, name: str) -> Path:
    folder = root / name
    if folder.exists():
        return folder
    shutil.copytree(CORPUS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(folder / "data" / "input.txt", folder / "input.txt")
    if name == "edited_text":
        edited, _ = reverse_a_word_first_read_at((folder / "input.txt").read_text(), step=2)
        (folder / "input.txt").write_text(edited)
    if name == "edited_config":
        config = json.loads((folder / "configs" / "base.json").read_text())
        config["optimizer"]["weight_decay"] = 0.05
        (folder / "configs" / "base.json").write_text(json.dumps(config, indent=2))
    return folder


# --- recording and comparing through the CLI, each once -----------------------------------------


def _cli(
    *args: str, cwd: Path, env: tuple[tuple[str, str], ...] = ()
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=dict(env))


class Corpus:
    """Records each distinct run and compares each pair once, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[Run, Path] = {}
        self.reports: dict[tuple[Run, Run], tuple[int, dict[str, Any], str]] = {}

    def recorded(self, run: Run) -> Path:
        if run not in self.runs:
            tree = _tree(self.root, run.tree)
            out = self.root / "runs" / f"r{len(self.runs)}"
            done = _cli(
                "record", "--quiet", "--out", str(out), "--", *run.command, cwd=tree, env=run.env
            )
            assert done.returncode == 0, (run, done.stderr[-2000:])
            self.runs[run] = out
        return self.runs[run]

    def compared(self, a: Run, b: Run) -> tuple[int, dict[str, Any], str]:
        if (a, b) not in self.reports:
            first, second = self.recorded(a), self.recorded(b)
            done = _cli("compare", str(first), str(second), "--json", cwd=self.root)
            assert done.returncode in (0, 1), done.stderr[-2000:]
            # kept beside the runs, to read after a failure
            (self.root / "reports").mkdir(exist_ok=True)
            (self.root / "reports" / f"{first.name}-{second.name}.json").write_text(done.stdout)
            self.reports[a, b] = (done.returncode, json.loads(done.stdout), done.stderr)
        return self.reports[a, b]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("corpus"))


# --- what a verdict must satisfy -----------------------------------------------------------------


def _at_or_before(value: int | None, step: int) -> bool:
    return value is not None and value <= step


def _named_streams_differ(report: dict[str, Any]) -> bool:
    verdict = report["verdict"]
    named = set(verdict["rng"])
    seen = {stream for entry in report["timeline"] for stream in entry["streams"]}
    return bool(named) and (bool(verdict["reseeded"]) or named <= seen)


PRECONDITIONS: dict[str, tuple[str, Any]] = {
    "data_order": (
        "the sample indices differ at or before the step",
        lambda r: _at_or_before(r["first_log_difference"]["order"], r["verdict"]["step"]),
    ),
    "data_content": (
        "the sample indices are equal up to the step and the batch differs at or before it",
        lambda r: (
            not _at_or_before(r["first_log_difference"]["order"], r["verdict"]["step"])
            and _at_or_before(r["first_log_difference"]["batch"], r["verdict"]["step"])
        ),
    ),
    "config": (
        "a config value, an argument of the command line or an optimizer setting differs, and is "
        "named",
        lambda r: bool(r["config_diff"]) or bool(r["verdict"]["config_keys"]),
    ),
    "rng_state": (
        "the streams it names differ in the records or were reseeded",
        _named_streams_differ,
    ),
    "environment": (
        "an environment setting or variable differs",
        lambda r: bool(r["environment_diff"]) or bool(r["verdict"]["environment_keys"]),
    ),
    "nondeterministic_op": (
        "a run differs from itself",
        lambda r: any(
            e["experiment"] == "self_rerun" and e["outcome"] == "differs"
            for e in r["verdict"]["evidence"]
        ),
    ),
}


def precondition_violations(report: dict[str, Any]) -> list[str]:
    """What a compare report's verdict claims that its own records contradict (empty: none)."""
    verdict = report["verdict"]
    if verdict is None:
        return []
    problems = []
    rule = PRECONDITIONS.get(verdict["cause"])
    if rule is not None and not rule[1](report):
        problems.append(f"cause {verdict['cause']} needs: {rule[0]}")
    first, step = report["first_log_difference"], verdict["step"]
    data_differs = _at_or_before(first["order"], step) or _at_or_before(first["batch"], step)
    # the step's data differs before its first forward: its first batch, or an earlier step's
    data_first = (
        _at_or_before(first["order"], step)
        or _at_or_before(first["batch"], step - 1)
        or first["first_batch"] == step
    )
    if verdict["phase"] == "data" and not data_differs:
        problems.append(
            "phase data needs the sample indices or the batch to differ at or before the step"
        )
    if verdict["phase"] in ("forward", "backward", "optimizer") and data_first:
        problems.append(
            f"phase {verdict['phase']} while the records show the step's data differing: the data "
            "comes first"
        )
    lines = [verdict["explanation"], verdict["fix"], *(e["detail"] for e in verdict["evidence"])]
    problems += [f"prints None: {line}" for line in lines if re.search(r"\bNone\b", line)]
    return problems


def _line_of(script: Path, text: str) -> int:
    return next(
        number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line
    )


def check_verdict(case: Case, corpus: Corpus) -> None:
    code, report, stderr = corpus.compared(case.a, case.b)
    expected, verdict = case.expected, report["verdict"]
    if expected.identical:
        assert code == 0 and report["identical"] and verdict is None, (verdict, report["notes"])
        return
    assert code == 1 and verdict is not None, stderr[-2000:]
    got = (verdict["step"], verdict["phase"], verdict["cause"])
    assert got == (expected.step, expected.phase, expected.cause), (verdict, report["notes"])
    if expected.layer is not None:
        assert verdict["layer"] == expected.layer, verdict
    if expected.rng is not None:
        assert tuple(verdict["rng"]) == expected.rng, verdict
    if expected.flag is not None:
        named = " ".join(
            [verdict["explanation"], *verdict["config_keys"], *verdict["environment_keys"]]
        )
        assert expected.flag.lstrip("-") in named, verdict
    if "config_key" in case.extra:  # the command line is the config, whatever parses it
        assert case.extra["config_key"] in report["config_diff"], report["config_diff"]
    if expected.reseeded_at is not None:
        script = _tree(corpus.root, case.b.tree) / case.b.command[1]
        assert (
            verdict["reseeded"][0]["where"] == f"{script}:{_line_of(script, expected.reseeded_at)}"
        ), verdict


def _marked(case: Case, reason: str | None) -> Any:
    marks = [pytest.mark.slow] if case.ci else [pytest.mark.slow, pytest.mark.extended]
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return pytest.param(case, id=case.name, marks=marks)


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [_marked(case, case.wrong) for case in CASES])
def test_the_verdict_on_a_corpus_script_is_the_planted_bug(case: Case, corpus: Corpus) -> None:
    check_verdict(case, corpus)


@pytest.mark.parametrize("case", [_marked(case, case.precondition_broken) for case in CASES])
def test_every_corpus_verdict_satisfies_its_causes_precondition(case: Case, corpus: Corpus) -> None:
    _, report, _ = corpus.compared(case.a, case.b)
    assert precondition_violations(report) == [], (
        report["verdict"],
        report["first_log_difference"],
        report["config_diff"],
    )
    # the package's own rule table (bisect_repro/diagnose/compare/rules.py) agrees
    assert_rules_hold(report)


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    [pytest.param(run, id=name, marks=[pytest.mark.extended]) for name, run in SAME_TWICE.items()],
)
def test_the_same_command_recorded_twice_is_identical(run: Run, corpus: Corpus) -> None:
    code, report, stderr = corpus.compared(run, Run(run.command, run.tree, copy=1))
    assert code == 0 and report["identical"] and report["verdict"] is None, (
        report["verdict"],
        stderr[-2000:],
    )


def test_the_planted_word_is_first_read_by_the_step_the_case_expects() -> None:
    text = (CORPUS / "data" / "input.txt").read_text()
    edited, step = reverse_a_word_first_read_at(text, step=2)
    changed = {i for i, (x, y) in enumerate(zip(text, edited, strict=True)) if x != y}
    batches = window_batches(len(text), 3)
    assert len(edited) == len(text) and sorted(set(edited)) == sorted(set(text)) and changed
    assert [bool(changed & batch) for batch in batches] == [False, False, True] and step == 2


def _first_differences(order: int | None = None, batch: int | None = None) -> dict[str, Any]:
    """A report's first step log differences where each step noted one batch."""
    return {"order": order, "batch": batch, "loss": None, "first_batch": batch}


def _fake_report(cause: str, **records: Any) -> dict[str, Any]:
    verdict = {
        "step": 5,
        "phase": "data",
        "cause": cause,
        "rng": [],
        "reseeded": [],
        "config_keys": [],
        "environment_keys": [],
        "explanation": "step 5 differs",
        "fix": "seed it",
        "evidence": [],
    }
    report = {
        "verdict": verdict,
        "first_log_difference": _first_differences(batch=5),
        "config_diff": {},
        "environment_diff": {},
        "timeline": [],
        "unused_streams": [],
    }
    for key, value in records.items():
        (verdict if key in verdict else report)[key] = value
    return report


@pytest.mark.parametrize(
    ("report", "broken"),
    [
        (_fake_report("data_order"), "cause data_order needs"),  # the GAN's verdict: order None
        (
            _fake_report("data_order", first_log_difference=_first_differences(order=5, batch=5)),
            None,
        ),
        (
            _fake_report("data_content", first_log_difference=_first_differences(order=5, batch=5)),
            "cause data_content needs",
        ),
        (_fake_report("data_content"), None),
        (_fake_report("config"), "cause config needs"),
        (
            _fake_report("config", config_diff={"--gamma": [0.7, 0.5]}, config_keys=["--gamma"]),
            None,
        ),
        (_fake_report("config", config_keys=["--gamma"]), None),
        (
            _fake_report("rng_state", rng=["numpy"], timeline=[{"streams": ["python"]}]),
            "cause rng_state needs",
        ),
        (_fake_report("rng_state", rng=["numpy"], timeline=[{"streams": ["numpy"]}]), None),
        (_fake_report("rng_state", rng=["torch"], reseeded=[{"where": "vae.py:9"}]), None),
        (
            _fake_report("unknown", first_log_difference=_first_differences()),
            "phase data needs",
        ),
        (_fake_report("unknown", explanation="equal up to step None"), "prints None"),
        (
            _fake_report(
                "rng_state", phase="forward", rng=["torch"], reseeded=[{"where": "vae.py:9"}]
            ),
            "the data comes first",
        ),
    ],
)
def test_the_precondition_check_catches_a_verdict_its_records_contradict(
    report: dict[str, Any], broken: str | None
) -> None:
    problems = precondition_violations(report)
    assert (broken is None and problems == []) or (
        broken is not None and any(broken in p for p in problems)
    ), problems


@pytest.mark.slow
@pytest.mark.extended
def test_doctor_on_a_seeded_corpus_script_finds_it_reproducible(corpus: Corpus) -> None:
    """A package run with ``-m`` (the script whose doctor run is cheapest of the seeded ones)."""
    done = _cli(
        "doctor",
        "--json",
        "--",
        *py("-m", "imgclf.train", "--epochs", "1"),
        cwd=_tree(corpus.root, "pristine"),
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert report["reproducible"] and not [
        f for f in report["findings"] if f["severity"] == "error"
    ], report


@pytest.mark.slow
@pytest.mark.extended
def test_doctor_on_a_corpus_script_with_an_unseeded_split_finds_numpy(corpus: Corpus) -> None:
    done = _cli(
        "doctor",
        "--json",
        "--",
        *py("tabular_numpy_split.py", "--epochs", "1"),
        cwd=_tree(corpus.root, "pristine"),
    )
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert not report["reproducible"] and any("numpy" in json.dumps(f) for f in found), report
