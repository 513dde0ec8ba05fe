"""Determinism tests for your own test suite: record the code twice, compare, fail with the verdict.

    from bisect_repro.testing import assert_reproducible, assert_reproducible_script

    def test_training_is_reproducible():
        assert_reproducible("train.py:build", steps=10, config={"lr": 0.01})

    def test_the_training_script_is_reproducible():
        assert_reproducible_script(["train.py", "--out", "{out}", "--steps", "10"])

Each function records the code twice, each time in a fresh Python process (``python -m
bisect_repro.cli record`` for a recipe, the script itself for a script with its own loop), then
runs :func:`bisect_repro.compare` on the two runs (with its replay and experiments, unless
``replay=False``). When the runs differ, the test fails (``pytest.fail`` in a pytest test,
an ``AssertionError`` elsewhere) with the verdict: where the runs part, the cause, how sure
(proven, inferred, unexplained), the explanation and the fix; the two runs and an HTML report
(``report.html``) are kept in ``out`` and the message names them. When they match, the
:class:`CompareResult` is returned and, if ``out`` was not given, the runs are deleted.

:func:`reproducibility` is a plain pytest fixture (import it into a ``conftest.py``) that keeps
the runs under pytest's ``tmp_path``.

A recipe's second run is recorded ``--against`` the first (:mod:`bisect_repro.record.against`):
it stops at the snapshot after the one that shows its first difference, so a run that parts early
costs the steps up to there, not the whole run.

Where the guarantees stop: two runs on one machine, one after the other, show what differs
between two processes (unseeded streams, reseeding, string hashing, nondeterministic ops that
misbehave here); they cannot show what differs on another machine, GPU, library version or
thread count unless ``env`` sets it, nor randomness that starts after ``steps``. A
nondeterministic op may agree with itself by chance in a short test. The code is imported and run
as it is on this machine: only check code you trust.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

from .diagnose.compare.causes.registry import cause_title
from .diagnose.compare.compare import compare
from .diagnose.compare.verdict import CompareResult
from .report.html import comparison_html, run_losses, write_html
from .report.text import named_by, verdict_where

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import pytest
except ImportError:  # the helpers work without pytest; only the fixture needs it
    pytest = None  # type: ignore[assignment]

__all__ = [
    "CheckOptions",
    "Reproducibility",
    "assert_reproducible",
    "assert_reproducible_script",
    "failure_message",
    "reproducibility",
]


def _fail(message: str) -> NoReturn:
    """``pytest.fail`` inside a pytest test (a short report, no traceback); an ``AssertionError``
    anywhere else."""
    if pytest is not None and "PYTEST_CURRENT_TEST" in os.environ:
        pytest.fail(message, pytrace=False)
    raise AssertionError(message)


def failure_message(subject: str, result: CompareResult) -> str:
    """The verdict of a comparison in a few lines: where, cause and confidence, explanation, fix."""
    verdict = result.verdict
    if verdict is None:
        return f"{subject} is not reproducible: the runs differ; the comparison gave no verdict."
    where = ", ".join(
        f"{label} {value}" if label else value for label, value in verdict_where(verdict)
    )
    named = named_by(verdict)
    cause = cause_title(verdict.cause) + (f" ({', '.join(named)})" if named else "")
    explanation = verdict.explanation.rstrip(".")
    lines = [
        f"{subject} is not reproducible: the runs diverge at {where}.",
        f"Cause: {cause}, {verdict.confidence.value}.",
        f"{explanation[:1].upper()}{explanation[1:]}.",
        f"Fix: {verdict.fix}",
    ]
    return "\n".join(lines)


@contextmanager
def _folder(out: Path | str | None) -> Iterator[Path]:
    """``out`` (created), or a temporary folder deleted unless the check failed."""
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        yield Path(out)
        return
    folder = Path(tempfile.mkdtemp(prefix="bisect-repro-"))
    yield folder  # not reached on a failure: the runs stay for a look
    shutil.rmtree(folder, ignore_errors=True)


def _run(
    command: Sequence[str],
    label: str,
    subject: str,
    *,
    cwd: Path | str | None,
    env: Mapping[str, str] | None,
    timeout: float,
) -> None:
    environment = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            list(command),
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _fail(
            f"recording run {label} of {subject} took more than {timeout:g} s: {' '.join(command)}"
        )
    except OSError as error:
        _fail(f"recording run {label} of {subject} could not start ({error}): {' '.join(command)}")
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        _fail(
            f"recording run {label} of {subject} failed with exit code {done.returncode}: "
            f"{' '.join(command)}\n{tail}"
        )


class CheckOptions(TypedDict, total=False):
    """The keyword arguments both checks take, besides what they record."""

    env: Mapping[str, str] | None
    """Environment variables for both recordings (``{"OMP_NUM_THREADS": "2"}``)."""
    replay: bool
    """``False`` judges from the records alone (faster, and the cause is then ``inferred``); default
    ``True``."""
    out: Path | str | None
    """The folder for the two runs (``a``, ``b``) and, on a failure, ``report.html``; default: a
    temporary folder, deleted when the runs match."""
    cwd: Path | str | None
    """The working directory of both recordings."""
    timeout: float
    """Seconds each recording may take; default 600."""


def _check(
    subject: str,
    command: Callable[[Path, Path | None], list[str]],
    *,
    env: Mapping[str, str] | None = None,
    replay: bool = True,
    out: Path | str | None = None,
    cwd: Path | str | None = None,
    timeout: float = 600.0,
) -> CompareResult:
    """Record ``command(run, reference)`` for runs ``a`` (no reference) and ``b`` (run ``a`` its
    reference) in ``out``, compare them, and fail unless they match."""
    with _folder(out) as folder:
        runs = folder / "a", folder / "b"
        for label, run in zip("AB", runs, strict=True):
            if run.exists() and not (run / "run.json").is_file():
                raise ValueError(
                    f"{run}: exists and is not a run; give an 'out' folder without 'a' and 'b' in "
                    "it"
                )
            shutil.rmtree(run, ignore_errors=True)  # a run from an earlier check
            reference = runs[0] if label == "B" else None
            _run(command(run, reference), label, subject, cwd=cwd, env=env, timeout=timeout)
        result = compare(*runs, replay=replay)
        if not result.identical:
            report = folder / "report.html"
            write_html(report, comparison_html(result, run_losses(runs)))
            _fail(f"{failure_message(subject, result)}\nThe two runs and an HTML report: {report}")
        return result


def assert_reproducible(
    target: str,
    *,
    steps: int = 10,
    every: int = 5,
    checkpoint_every: int | None = None,
    config: Mapping[str, Any] | None = None,
    **options: Unpack[CheckOptions],
) -> CompareResult:
    """Record the recipe ``target`` (``path/file.py:function`` or ``module:function``) twice and
    fail unless the runs match.

    ``config`` holds the recipe's keyword arguments (``--set``); ``checkpoint_every`` defaults to
    ``every``. The other options (``env``, ``replay``, ``out``, ``cwd``, ``timeout``) are
    :class:`CheckOptions`.
    """
    settings = [
        arg
        for key, value in (config or {}).items()
        for arg in ("--set", f"{key}={json.dumps(value)}")
    ]
    flags = [
        "--steps",
        str(steps),
        "--every",
        str(every),
        "--checkpoint-every",
        str(checkpoint_every or every),
        "--quiet",
    ]

    def command(run: Path, reference: Path | None) -> list[str]:
        against = ["--against", str(reference), "--no-verdict"] if reference is not None else []
        return [
            sys.executable,
            "-m",
            "bisect_repro.cli",
            "record",
            target,
            "--out",
            str(run),
            *flags,
            *settings,
            *against,
        ]

    return _check(target, command, **options)


def assert_reproducible_script(
    argv: Sequence[str], **options: Unpack[CheckOptions]
) -> CompareResult:
    """Run a script with its own loop (it records with ``Recorder``) twice and fail unless the runs
    match.

    ``argv`` is the command; ``{out}`` in it is replaced by each run's directory. A first item
    ending in ``.py``, or ``-m``, runs under this interpreter (``["train.py", "--out", "{out}"]``,
    ``["-m", "pkg.train", "--out={out}"]``); anything else runs as given. The options (``env``,
    ``replay``, ``out``, ``cwd``, ``timeout``) are :class:`CheckOptions`.
    """
    if not any("{out}" in arg for arg in argv):
        raise ValueError(
            f"{list(argv)}: put '{{out}}' where the script takes its run directory, such as "
            "['train.py', '--out', '{out}']"
        )
    prefix = [sys.executable] if argv and (argv[0].endswith(".py") or argv[0] == "-m") else []

    def command(run: Path, _: Path | None) -> list[str]:  # the script's own Recorder: no reference
        return [*prefix, *(arg.replace("{out}", str(run)) for arg in argv)]

    return _check(" ".join(argv), command, **options)


class Reproducibility:
    """What the :func:`reproducibility` fixture gives a test: the two checks, each in its own folder
    under ``tmp_path``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._count = 0

    def _next(self) -> Path:
        self._count += 1
        return self.folder / f"reproducibility-{self._count}"

    def recipe(self, target: str, **options: Any) -> CompareResult:
        """:func:`assert_reproducible` with ``out`` under ``tmp_path``."""
        return assert_reproducible(target, out=self._next(), **options)

    def script(self, argv: Sequence[str], **options: Any) -> CompareResult:
        """:func:`assert_reproducible_script` with ``out`` under ``tmp_path``."""
        return assert_reproducible_script(argv, out=self._next(), **options)


if pytest is not None:

    @pytest.fixture
    def reproducibility(tmp_path: Path) -> Reproducibility:
        """``reproducibility.recipe("train.py:build")``, ``reproducibility.script(["train.py",
        "--out", "{out}"])``."""
        return Reproducibility(tmp_path)

else:

    def reproducibility(tmp_path: Path) -> Reproducibility:
        """Without pytest: the same object, for a folder you give."""
        return Reproducibility(tmp_path)
